#!/usr/bin/env bash
# Which part of the read-only unshare sandbox stops CUDA (cudaGetDeviceCount error 304 on the
# H200 host, 2026-12-06)? One CUDA init per variant, as root:  scripts/sandbox_gpu_diag.sh OUT_DIR
set -u
out=$1; scratch=$(mktemp -d /var/tmp/diag.XXXX); here=$(mktemp -d /var/tmp/diagbin.XXXX)
cat > "$here/probe.py" <<'PY'
import torch
torch.cuda.init(); print("CUDA OK", torch.cuda.get_device_name())
PY
cat > "$here/rw_dev.sh" <<SH
#!/bin/sh
# make every mount under /dev writable again, then run the rest
for m in \$(awk '{print \$5}' /proc/self/mountinfo | grep '^/dev'); do mount -o remount,bind,rw "\$m"; done
exec "\$@"
SH
chmod +x "$here/rw_dev.sh"
ro="python3 -I $PWD/kforge/verifier/ro_mounts.py $scratch --"
caps="setpriv --bounding-set -all --inh-caps -all --no-new-privs --"
ns="unshare --net --pid --fork --kill-child --mount --mount-proc"
probe="python3 $here/probe.py"
# RO_NEW: another ro_mounts.py to try (a candidate fix), as "new" and "new+caps"
new="python3 -I ${RO_NEW:-} $scratch --"
variants="plain ro caps ro+caps ro-but-dev ro-but-dev+caps${RO_NEW:+ new new+caps}"
{
  grep -E ' /dev' /proc/self/mountinfo; ls -ld /dev/nvidia* /dev/shm
  for v in $variants; do
    case $v in
      plain) cmd="$ns $probe" ;;
      ro) cmd="$ns $ro $probe" ;;
      caps) cmd="$ns $caps $probe" ;;
      ro+caps) cmd="$ns $ro $caps $probe" ;;
      ro-but-dev) cmd="$ns $ro $here/rw_dev.sh $probe" ;;
      ro-but-dev+caps) cmd="$ns $ro $here/rw_dev.sh $caps $probe" ;;
      new) cmd="$ns $new $probe" ;;
      new+caps) cmd="$ns $new $caps $probe" ;;
    esac
    echo "== $v"; timeout 60 $cmd 2>&1 | tail -2
  done
} > "$out/sandbox_diag.txt" 2>&1
cat "$out/sandbox_diag.txt"
