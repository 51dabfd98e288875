# shellcheck shell=bash
# The official MCP Python SDK as an outside client of pstack-store (sourced by
# scripts/test; uses apt_need).
#
# - python3-venv: a venv at /opt/pstack-mcp-python-<version> with the SDK
#   (`mcp` on PyPI), pinned. store/tests/mcp/sdk.rs drives the store's MCP
#   tools through it (store/tests/mcp/sdk_client.py) over stdio and streamable
#   HTTP (env PSTACK_MCP_PYTHON overrides the interpreter).

apt_need python3-venv

pstack_mcp_version=2.3.0
pstack_mcp_venv=/opt/pstack-mcp-python-$pstack_mcp_version
if [ ! -x "$pstack_mcp_venv/bin/python" ] \
    || ! "$pstack_mcp_venv/bin/python" -c 'import mcp.client.stdio, mcp.client.streamable_http' 2>/dev/null; then
    /usr/bin/python3 -m venv "$pstack_mcp_venv"
    "$pstack_mcp_venv/bin/pip" install --quiet --disable-pip-version-check \
        "mcp==$pstack_mcp_version"
fi
