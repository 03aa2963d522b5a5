#!/usr/bin/env bash
# The micro-VM tier's needs (issue 18), idempotent and cached:
# - qemu-system-x86 (QEMU `-M microvm`; TCG where /dev/kvm cannot run guests),
#   e2fsprogs (mkfs.ext4 -d for root disks), dpkg-deb;
# - Debian's cloud kernel, the version linux-image-cloud-amd64 depends on, downloaded
#   as a .deb (never installed) and extracted with `dpkg-deb -x` into
#   /var/cache/tessera-ci/kernel/x. The tests read TESSERA_VM_KERNEL (that folder).
set -euo pipefail
cache=/var/cache/tessera-ci/kernel
need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi
if ls "$cache"/x/boot/vmlinuz-* >/dev/null 2>&1; then
    echo "guest kernel cached: $(ls "$cache"/x/boot/vmlinuz-*)"
    exit 0
fi
mkdir -p "$cache"
cd "$cache"
if ! ls linux-image-*-cloud-amd64_*.deb >/dev/null 2>&1; then
    # The versioned package the meta-package points at.
    pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -1)
    if [ -z "$pkg" ]; then
        apt-get update
        pkg=$(apt-cache depends linux-image-cloud-amd64 |
            sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -1)
    fi
    [ -n "$pkg" ] || { echo "vm-kernel: no linux-image-*-cloud-amd64 in apt's lists" >&2; exit 1; }
    apt-get download "$pkg"
fi
rm -rf x.tmp
dpkg-deb -x linux-image-*-cloud-amd64_*.deb x.tmp
mv x.tmp x
echo "guest kernel extracted: $(ls "$cache"/x/boot/vmlinuz-*)"
