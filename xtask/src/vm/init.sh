#!/bin/busybox sh
# PID 1 of the soft-RoCE VM (busybox sh, inside the initramfs built by `cargo xtask`).
# Mounts the host's root read-only over virtio-9p, the host's cargo target directory
# read-write at its own path, and runs the generated guest script in a chroot there.
# Reports progress as "@@xtask-vm <nonce> <event>" lines on the console.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

arg() {
    for word in $(cat /proc/cmdline); do
        case "$word" in "$1"=*) echo "${word#*=}" ;; esac
    done
}
NONCE=$(arg xtask.nonce)
SCRIPT=$(arg xtask.script)
SHARE=$(arg xtask.share)
mark() { echo "@@xtask-vm $NONCE $*"; }
die() { mark fail "$*"; poweroff -f; sleep 60; }

mark init
for module in $(cat /etc/modules.order); do
    insmod "$module" || die "insmod $module"
done
R=/mnt/root
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot $R \
    || die "mounting the host root over 9p (mount tag hostroot)"
mount -t proc proc $R/proc || die "mounting /proc"
mount -t sysfs sysfs $R/sys || die "mounting /sys"
mount -t devtmpfs devtmpfs $R/dev || die "mounting /dev"
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
# The guest gets its own /tmp. A workspace that lives under the host's /tmp (a CI clone,
# say) would vanish under it, so keep a handle on it and put it back on top.
WS=$(dirname "$SHARE")
case "$WS" in
    /tmp/*)
        mkdir -p /mnt/ws
        mount --bind "$R$WS" /mnt/ws || die "keeping the workspace $WS"
        ;;
    *) WS= ;;
esac
mount -t tmpfs tmpfs $R/tmp || die "mounting /tmp"
if [ -n "$WS" ]; then
    mkdir -p "$R$WS"
    mount --bind /mnt/ws "$R$WS" || die "restoring the workspace $WS"
fi
mount -t tmpfs tmpfs $R/run || die "mounting /run"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "$R$SHARE" \
    || die "mounting the writable share at $SHARE"
mark root
chroot $R /bin/sh "$SCRIPT"
mark exit $?
sync
poweroff -f
sleep 60
