# shellcheck shell=bash
# Setup for the packaging tests (packaging/tests), sourced by scripts/test (uses apt_need).
#
# - binutils (objcopy, readelf, objdump), dpkg-dev, rpm (rpmbuild, rpm -qlp), fakeroot:
#   packaging/build splits debug info and builds the .deb/.rpm packages;
# - mmdebstrap: the install test creates a bare Debian root from the Debian
#   archive (cached as a tarball under /var/cache/pstack-packaging);
# - systemd: `systemd-analyze verify` / `security --offline=true` on the units;
# - systemd-container: systemd-nspawn boots the bare root with systemd as its
#   PID 1, so pstackd runs under its shipped unit (packaging/tests/unit_sandbox.rs);
# - python3-venv: a venv at /opt/pstack-kubernetes-validate with the
#   kubernetes-validate package (PyPI; it ships the Kubernetes OpenAPI
#   schemas) and PyYAML, for the manifest tests.

apt_need binutils dpkg-dev rpm fakeroot mmdebstrap systemd systemd-container python3-venv

pstack_k8s_venv=/opt/pstack-kubernetes-validate
if [ ! -x "$pstack_k8s_venv/bin/kubernetes-validate" ]; then
    /usr/bin/python3 -m venv "$pstack_k8s_venv"
    "$pstack_k8s_venv/bin/pip" install --quiet 'kubernetes-validate==1.37.0' 'PyYAML>=6'
fi
