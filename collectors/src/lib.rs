//! Typed surface readers for pstack: procfs, net, longhorn. Parsing is pure; reading is a thin shell.
