#!/bin/bash
# (A copy of ../shared/tools/rxe-vm/run-rxe-vm.sh, whose NOTES.md has the facts behind it; CI runs it
# through tools/rxe-vm/ci.sh.)
# Boot a Debian bookworm kernel (which ships rdma_rxe = Soft-RoCE as a module) in qemu (TCG),
# create Soft-RoCE devices inside the VM and run real libibverbs programs over them.
# Needs no RDMA support in the host kernel.
#
# Usage: run-rxe-vm.sh [--no-install] [--test NAME]... [--extra HOSTFILE]... [--cmd 'CMDLINE'] [--hostroot]
#   --no-install       skip apt-get (packages already there)
#   --test NAME        in-VM tests to run (default: all of): eth0 perftest rdmacm lo dummy veth netns extra
#                      ("--test none" = just boot, create rxe0 and power off)
#   --extra HOSTFILE   copy a host binary plus the libraries ldd lists into the initramfs at /extra/
#   --cmd 'CMDLINE'    shell command the "extra" test runs in the VM (default: each /extra/* without args)
#   --hostroot         share the host's / read-only into the VM (virtio-9p), and run --cmd chrooted
#                      into it: host binaries (e.g. cargo test executables) run with the host's own
#                      libraries, nothing copied
# In the VM, rxe0 (Soft-RoCE on eth0, 192.168.77.1/24; GID index 1 = ::ffff:192.168.77.1, RoCE v2)
# always exists.  Exit status: 0 iff the VM finished, no test FAILed and --cmd exited 0.
# Env: WORK (default ${TMPDIR:-/tmp}/rxe-vm-build), QEMU_CPU (default qemu64), ACCEL (tcg|kvm, default tcg)
set -euo pipefail

WORK=${WORK:-${TMPDIR:-/tmp}/rxe-vm-build}
ACCEL=${ACCEL:-tcg}          # /dev/kvm on this workplace's machines does not work (see REPORT.md)
QEMU_CPU=${QEMU_CPU:-qemu64} # TCG runs ~2x faster with qemu64 than with -cpu max here
INSTALL=1; HOSTROOT=0; EXTRA_CMD=""; EXTRAS=(); TESTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) INSTALL=0 ;;
    --test) TESTS+=("$2"); shift ;;
    --extra) EXTRAS+=("$(readlink -f "$2")"); shift ;;
    --cmd) EXTRA_CMD=$2; shift ;;
    --hostroot) HOSTROOT=1 ;;
    *) echo "unknown arg $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#TESTS[@]} -eq 0 ] && TESTS=(eth0 perftest rdmacm lo dummy veth netns extra)
now() { date +%s.%N; }
t0=$(now)
mkdir -p "$WORK"; cd "$WORK"

# ------------------------------------------------------------------ 1. packages + kernel
if [ "$INSTALL" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    qemu-system-x86 busybox-static kmod cpio gzip iproute2 \
    rdma-core ibverbs-providers ibverbs-utils libibverbs-dev perftest rdmacm-utils >/dev/null
fi
# The kernel .deb is only unpacked (not installed on the host: no initramfs hooks, no bootloader).
if [ ! -d kroot/lib/modules ]; then
  KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  rm -rf debs kroot; mkdir -p debs kroot
  (cd debs && apt-get download "$KPKG" 2>/dev/null)
  dpkg-deb -x debs/"$KPKG"_*.deb kroot
fi
KV=$(ls kroot/lib/modules | head -1)
[ -f "kroot/lib/modules/$KV/modules.dep" ] || depmod -b "$WORK/kroot" "$KV"
VMLINUZ=$WORK/kroot/boot/vmlinuz-$KV

# ------------------------------------------------------------------ 2. initramfs
R=$WORK/initramfs
rm -rf "$R"
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib/modules,usr/bin,usr/sbin,extra,var}
ln -s ../run "$R/var/run"
cp /bin/busybox "$R/bin/busybox"
for a in $(/bin/busybox --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done

# Kernel modules in load order; host modprobe resolves the dependencies against the unpacked tree.
# crc32_generic is a soft dependency of rdma_rxe that modinfo does not list: without it
# `rdma link add` fails with "rdma_rxe: failed to add eth0" / "error: No such file or directory".
MODS="virtio_pci virtio_net veth dummy crc32_generic rdma_rxe ib_uverbs rdma_ucm 9p 9pnet_virtio"
: > "$R/lib/modules/load.list"
for m in $MODS; do
  modprobe -d "$WORK/kroot" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  cp "$ko" "$R/lib/modules/"; basename "$ko" >> "$R/lib/modules/load.list"
done

copy_with_libs() { # FILE [DEST]: copy FILE and every library ldd lists for it, keeping paths
  local f=$1 dst=${2:-$1}
  mkdir -p "$R/$(dirname "$dst")"; cp -L "$f" "$R/$dst"
  ldd "$f" 2>/dev/null | grep -oE '/[^ ]+' | while read -r lib; do
    [ -e "$R$lib" ] && continue
    mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib"
  done
}
for b in ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rdma ip \
         ib_write_bw ib_send_bw ib_read_bw ib_write_lat rping; do
  copy_with_libs "$(command -v $b)" "/usr/bin/$b"
done
MA=x86_64-linux-gnu
# libibverbs dlopen()s its provider, found through /etc/libibverbs.d/rxe.driver
mkdir -p "$R/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
copy_with_libs /usr/lib/$MA/libibverbs/librxe-rdmav34.so
copy_with_libs /lib/$MA/libgcc_s.so.1            # Rust binaries need it
for e in "${EXTRAS[@]}"; do copy_with_libs "$e" "/extra/$(basename "$e")"; done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"
printf 'root:x:0:\n' > "$R/etc/group"
printf 'hosts: files\n' > "$R/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
echo "${TESTS[*]}" > "$R/etc/tests"
if [ -n "$EXTRA_CMD" ]; then printf '%s\n' "$EXTRA_CMD" > "$R/extra.cmd"; fi
if [ "$HOSTROOT" = 1 ]; then touch "$R/etc/hostroot"; fi

cat > "$R/init" <<'EOF'
#!/bin/sh
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /tmp
ulimit -l unlimited            # verbs memory registration pins pages
ip() { /usr/bin/ip "$@"; }     # busybox sh would otherwise run its own, limited, ip applet
up() { cut -d' ' -f1 /proc/uptime; }
echo "T+$(up) init started"
for ko in $(cat /lib/modules/load.list); do insmod /lib/modules/$ko; done
echo "T+$(up) modules loaded"
TESTS=" $(cat /etc/tests) "
want() { case "$TESTS" in *" $1 "*) return 0;; esac; return 1; }
result() { echo "RESULT $1 $2"; }
ok() { [ "$1" = 0 ] && [ "$2" = 0 ]; }
ip link set lo up

# pingpong NAME SERVERDEV CLIENTDEV CONNECT_IP GIDIDX [ibv_rc_pingpong args]: two processes
pingpong() {
  local name=$1 sdev=$2 cdev=$3 addr=$4 gid=$5; shift 5
  echo "=== $name: ibv_rc_pingpong server -d $sdev, client -d $cdev -> $addr (gid $gid) $*"
  timeout 60 ibv_rc_pingpong -d "$sdev" -g "$gid" "$@" > /tmp/srv.$name 2>&1 & local spid=$!
  sleep 1
  timeout 60 ibv_rc_pingpong -d "$cdev" -g "$gid" "$@" "$addr" > /tmp/cli.$name 2>&1; local crc=$?
  wait $spid; local src=$?
  echo "--- server:"; cat /tmp/srv.$name; echo "--- client:"; cat /tmp/cli.$name
  ok $crc $src && result "$name" PASS || result "$name" "FAIL(client=$crc server=$src)"
}

# always: Soft-RoCE device rxe0 on eth0 (qemu user net with restrict=on: nothing leaves the VM)
ip link set eth0 up
ip addr add 192.168.77.1/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 && echo "rdma link add rxe0 type rxe netdev eth0: ok"
rdma link show; ibv_devices; ibv_devinfo -d rxe0 | head -20
echo "T+$(up) rxe0 ready"

if want eth0; then
  pingpong eth0-rc-send rxe0 rxe0 192.168.77.1 1
  pingpong eth0-rc-send-64k rxe0 rxe0 192.168.77.1 1 -s 65536 -n 2000
  echo "=== eth0-ud: ibv_ud_pingpong"
  timeout 60 ibv_ud_pingpong -d rxe0 -g 1 > /tmp/ud.s 2>&1 & p=$!; sleep 1
  timeout 60 ibv_ud_pingpong -d rxe0 -g 1 127.0.0.1 > /tmp/ud.c 2>&1; c=$?; wait $p; s=$?
  cat /tmp/ud.s /tmp/ud.c; ok $c $s && result eth0-ud PASS || result eth0-ud "FAIL(client=$c server=$s)"
fi

if want perftest; then
  for t in ib_write_bw ib_send_bw ib_read_bw; do
    echo "=== perftest $t (RC, 64 KiB x 2000, rxe0 <-> rxe0)"
    timeout 90 $t -d rxe0 -x 1 -F -s 65536 -n 2000 > /tmp/p.s 2>&1 & p=$!; sleep 1
    timeout 90 $t -d rxe0 -x 1 -F -s 65536 -n 2000 127.0.0.1 > /tmp/p.c 2>&1; c=$?; wait $p; s=$?
    echo "--- client:"; cat /tmp/p.c
    ok $c $s && result "$t" PASS || result "$t" "FAIL(client=$c server=$s)"
  done
  echo "=== perftest ib_write_lat"
  timeout 90 ib_write_lat -d rxe0 -x 1 -F -n 1000 > /tmp/p.s 2>&1 & p=$!; sleep 1
  timeout 90 ib_write_lat -d rxe0 -x 1 -F -n 1000 127.0.0.1 > /tmp/p.c 2>&1; c=$?; wait $p; s=$?
  cat /tmp/p.c; ok $c $s && result ib_write_lat PASS || result ib_write_lat "FAIL(client=$c server=$s)"
fi

if want rdmacm; then
  echo "=== rdmacm: rping (librdmacm connection setup + RDMA READ/WRITE), 20 iterations"
  timeout 60 rping -s -a 192.168.77.1 -C 20 > /tmp/r.s 2>&1 & p=$!; sleep 1
  timeout 60 rping -c -a 192.168.77.1 -C 20 -v > /tmp/r.c 2>&1; c=$?; wait $p; s=$?
  head -3 /tmp/r.c; tail -1 /tmp/r.c; cat /tmp/r.s
  ok $c $s && result rdmacm-rping PASS || result rdmacm-rping "FAIL(client=$c server=$s)"
fi

if want lo; then
  echo "=== rxe on lo"
  if rdma link add rxelo type rxe netdev lo; then
    pingpong lo-rc-send rxelo rxelo 127.0.0.1 1
  else result lo-rdma-link-add FAIL; fi
fi

if want dummy; then
  echo "=== rxe on a dummy interface"
  ip link add dum0 type dummy && ip link set dum0 up && ip addr add 192.168.78.1/24 dev dum0
  if rdma link add rxedum type rxe netdev dum0; then
    pingpong dummy-rc-send rxedum rxedum 127.0.0.1 1
  else result dummy-rdma-link-add FAIL; fi
fi

if want veth; then
  echo "=== two rxe devices on the two ends of a veth pair (same netns + policy routing)"
  ip link add va type veth peer name vb; ip link set va up; ip link set vb up
  ip addr add 192.168.79.1/24 dev va; ip addr add 192.168.79.2/24 dev vb
  rdma link add rxea type rxe netdev va && rdma link add rxeb type rxe netdev vb
  # Both addresses are local, so by default .1<->.2 is routed through lo, where rxe drops it
  # (rxe looks its device up by skb->dev).  Force it over the veth wire instead:
  sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf.va.accept_local=1 net.ipv4.conf.vb.accept_local=1
  sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.va.rp_filter=0 net.ipv4.conf.vb.rp_filter=0
  ip rule add pref 1000 lookup local; ip rule del pref 0
  ip rule add pref 10 iif lo from 192.168.79.1 to 192.168.79.2 lookup 101
  ip rule add pref 11 iif lo from 192.168.79.2 to 192.168.79.1 lookup 102
  ip route add 192.168.79.2 dev va table 101; ip route add 192.168.79.1 dev vb table 102
  pingpong veth-rc-send rxea rxeb 192.168.79.1 1      # server on rxea, client on rxeb
  ip -s link show va | head -4
  rdma statistic show link rxea/1 | head -2
fi

if want netns; then
  echo "=== two rxe devices on a veth pair split across network namespaces (expected to fail on 6.1)"
  mkdir -p /run/netns
  ip netns add ns1; ip link add vc type veth peer name vd; ip link set vd netns ns1
  ip addr add 192.168.80.1/24 dev vc; ip link set vc up
  ip netns exec ns1 ip link set lo up
  ip netns exec ns1 ip addr add 192.168.80.2/24 dev vd; ip netns exec ns1 ip link set vd up
  rdma system show
  rdma link add rxec type rxe netdev vc && ip netns exec ns1 rdma link add rxed type rxe netdev vd && rdma link show
  timeout 20 ibv_rc_pingpong -d rxec -g 1 > /tmp/srv.ns 2>&1 & spid=$!; sleep 1
  ip netns exec ns1 timeout 20 ibv_rc_pingpong -d rxed -g 1 192.168.80.1 > /tmp/cli.ns 2>&1; crc=$?
  wait $spid; src=$?
  echo "--- server:"; cat /tmp/srv.ns; echo "--- client:"; cat /tmp/cli.ns
  ip -s link show vc | head -4
  ok $crc $src && result netns-rc-send PASS || result netns-rc-send "XFAIL(client=$crc server=$src)"
fi

if want extra && [ -e /extra.cmd ] && [ -e /etc/hostroot ]; then
  echo "=== extra, chrooted into the host's / (9p, read-only): $(cat /extra.cmd)"
  mkdir -p /hostroot
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /hostroot
  mount -t proc proc /hostroot/proc; mount -t sysfs sysfs /hostroot/sys
  mount -t devtmpfs devtmpfs /hostroot/dev
  mount -t tmpfs tmpfs /hostroot/run; mkdir -p /hostroot/run/tmp   # the only writable place
  RUST_BACKTRACE=1 TMPDIR=/run/tmp HOME=/run/tmp timeout 600 chroot /hostroot /bin/sh -c "$(cat /extra.cmd)"
  rc=$?; [ $rc = 0 ] && result extra-cmd PASS || result extra-cmd "FAIL(rc=$rc)"
elif want extra && [ -e /extra.cmd ]; then
  echo "=== extra: $(cat /extra.cmd)"
  (cd /extra && RUST_BACKTRACE=1 timeout 600 sh /extra.cmd); rc=$?
  [ $rc = 0 ] && result extra-cmd PASS || result extra-cmd "FAIL(rc=$rc)"
elif want extra; then
  for e in /extra/*; do
    [ -x "$e" ] || continue
    echo "=== extra: $e"; RUST_BACKTRACE=1 timeout 600 "$e"; rc=$?
    [ $rc = 0 ] && result "extra-$(basename $e)" PASS || result "extra-$(basename $e)" "FAIL(rc=$rc)"
  done
fi

echo "=== dmesg (rxe lines)"; dmesg | grep -iE 'rxe|infiniband' | tail -20
echo "T+$(up) tests done"
echo "ALL-DONE"
poweroff -f
EOF
chmod +x "$R/init"
(cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$WORK/initrd.cpio.gz"
t1=$(now)
echo "HOST: kernel $KV, initrd $(du -h "$WORK/initrd.cpio.gz" | cut -f1), prepare took $(awk "BEGIN{printf \"%.1f\", $t1-$t0}") s"

# ------------------------------------------------------------------ 3. boot
if [ "$ACCEL" = kvm ]; then ACC="-accel kvm -cpu host"; else ACC="-accel tcg,thread=multi -cpu $QEMU_CPU"; fi
VIRTFS=()
[ "$HOSTROOT" = 1 ] && VIRTFS=(-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap)
echo "HOST: qemu-system-x86_64 $ACC ${VIRTFS[*]}"
set +e
timeout 1800 qemu-system-x86_64 $ACC -m 2G -smp 2 -nographic -no-reboot \
  -kernel "$VMLINUZ" -initrd "$WORK/initrd.cpio.gz" \
  -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" \
  -netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,romfile= "${VIRTFS[@]}" \
  < /dev/null | tee "$WORK/vm.log"
qrc=${PIPESTATUS[0]}
set -e
t2=$(now)
echo "HOST: qemu exit $qrc; VM wall $(awk "BEGIN{printf \"%.1f\", $t2-$t1}") s; total $(awk "BEGIN{printf \"%.1f\", $t2-$t0}") s"
echo "HOST: summary"; grep -a '^RESULT' "$WORK/vm.log" || true
grep -aq '^ALL-DONE' "$WORK/vm.log" || { echo "HOST: VM did not finish"; exit 1; }
if grep -aq '^RESULT .* FAIL' "$WORK/vm.log"; then exit 1; fi
exit 0
