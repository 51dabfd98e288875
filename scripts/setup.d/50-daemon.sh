# shellcheck shell=bash
# Setup for pstackd's tests (agent/tests/daemon), sourced by scripts/test (uses apt_need).
#
# - curl: the authorization test connects as an unprivileged uid with
#   `curl --unix-socket` (the UX the API promises);
# - systemd: provides `systemd-analyze verify` for systemd/pstackd.{service,socket} and
#   `systemd-sysusers` for systemd/pstack.sysusers.conf (applied to a scratch root only);
# - util-linux (mount/umount): the tiny-tmpfs spool test mounts a tmpfs;
# - openssl: the TLS shipping test mints a throwaway CA and server certificate;
# - the `nogroup` and `users` groups (Debian base) serve as the tests' "configured group"; the
#   tests create nothing in /etc.
# No services are started: every test spawns its own pstackd and collector.

apt_need curl systemd util-linux openssl
