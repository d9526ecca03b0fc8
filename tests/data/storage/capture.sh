#!/bin/sh
# Records preflight/storage/probe.py's real output on this machine, for tests/test_storage_judge.py (as root, in a mount
# namespace of its own so that its mounts vanish with it). Run from the repository root: sh tests/data/storage/capture.sh
set -e
out=$(pwd)/tests/data/storage
exec unshare --mount --propagation private sh -s "$out" "$(pwd)/preflight/storage/probe.py" <<'SCRIPT'
set -e
out=$1 probe=$2
base=$(mktemp -d /tmp/preflight-capture-XXXXXX)
chmod 755 "$base"
mkdir -m 1777 "$base/ckpt" "$base/ro" "$base/tiny"
mkdir -m 700 "$base/private"
: > "$base/afile"
mount --bind "$base/ro" "$base/ro" && mount -o remount,bind,ro "$base/ro"
mount -t tmpfs -o size=1m,mode=1777 tmpfs "$base/tiny"
config() {  # $1 host, $2 round, then path:shared pairs
  host=$1 round=$2; shift 2
  paths=""
  for p in "$@"; do paths="$paths{\"path\":\"$base/${p%:*}\",\"shared\":${p#*:},\"write_bytes\":4194304},"; done
  echo "{\"host\":\"$host\",\"round\":\"$round\",\"nonce\":\"recorded\",\"hosts\":[\"h1\",\"h2\"],\"paths\":[${paths%,}],\"deadline_s\":15}"
}
cd /
all="ckpt:true ro:false tiny:false private:false missing:false afile:false"
PREFLIGHT_TAG=capture python3 - "$(config h1 write $all)" < "$probe" | sed "s#$base#/data#g" > "$out/write-root.json"
PREFLIGHT_TAG=capture setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 - "$(config h2 write $all)" < "$probe" \
  | sed "s#$base#/data#g" > "$out/write-nobody.json"
PREFLIGHT_TAG=capture python3 - "$(config h1 read ckpt:true)" < "$probe" | sed "s#$base#/data#g" > "$out/read-h1.json"
PREFLIGHT_TAG=capture python3 - "$(config h1 clean ckpt:true)" < "$probe" > /dev/null
ls -A "$base/ckpt" "$base/private" "$base/tiny"
umount "$base/tiny" "$base/ro"
rm -rf "$base"
SCRIPT
