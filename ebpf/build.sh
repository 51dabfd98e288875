#!/usr/bin/env bash
# Rebuild pstack's eBPF objects from ebpf/bpf/*.bpf.c, or check the committed ones.
#
#   ebpf/build.sh            rebuild ebpf/bpf/*.bpf.o in place (commit the result)
#   ebpf/build.sh --check    rebuild into a temp dir; exit 1 if any committed object differs
#   ebpf/build.sh --vmlinux  also regenerate ebpf/bpf/vmlinux.h from this kernel's BTF
#
# Toolchain: Debian 12's clang 14 + llvm-strip 14 + libbpf-dev 1.1 headers (scripts/setup.d/30-ebpf.sh).
# Objects are reproducible: -ffile-prefix-map drops the build directory from the debug info,
# and `llvm-strip -g` removes DWARF but keeps .BTF/.BTF.ext (aya needs them for CO-RE).
set -euo pipefail
cd "$(dirname "$0")/bpf"

CLANG=${CLANG:-clang}
STRIP=${LLVM_STRIP:-llvm-strip}
mode=build
for a in "$@"; do
    case "$a" in
        --check) mode=check ;;
        --vmlinux) bpftool btf dump file /sys/kernel/btf/vmlinux format c > vmlinux.h ;;
        *) echo "usage: $0 [--check] [--vmlinux]" >&2; exit 2 ;;
    esac
done

want_major=14
have_major=$("$CLANG" -dumpversion | cut -d. -f1)
if [ "$have_major" != "$want_major" ]; then
    echo "ebpf/build.sh: clang $have_major found; the committed objects are built with clang $want_major (Debian 12)" >&2
    exit 2
fi

out=.
if [ $mode = check ]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi

status=0
for src in *.bpf.c; do
    obj="$out/${src%.c}.o"
    "$CLANG" -g -O2 -target bpf -D__TARGET_ARCH_x86 -I. -I/usr/include/x86_64-linux-gnu \
        -ffile-prefix-map="$PWD"=. -c "$src" -o "$obj"
    "$STRIP" -g "$obj"
    if [ $mode = check ]; then
        if cmp -s "$obj" "${src%.c}.o"; then
            echo "ok       ${src%.c}.o matches a rebuild of $src"
        else
            echo "MISMATCH ${src%.c}.o differs from a rebuild of $src" >&2
            status=1
        fi
    else
        echo "built    ${src%.c}.o ($(stat -c %s "$obj") bytes)"
    fi
done
exit $status
