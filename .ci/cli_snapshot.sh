#!/usr/bin/env bash
# cli_snapshot.sh OUTDIR: run the bundled examples through `mpt` (piped, plain text) and keep what it prints and
# writes, timings, dates, hashes and the checkout path masked. Run from the repository root with the venv active;
# compare two snapshots (before and after a change that should not change behaviour) with: diff -r A B
set -u
OUT=$(realpath -m "${1:?usage: cli_snapshot.sh OUTDIR}")
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && [ ! -e "$OUT/.cli_snapshot" ]; then
  echo "cli_snapshot.sh: $OUT is not empty and is not a snapshot folder; give a new folder" >&2; exit 2
fi
mkdir -p "$OUT"; rm -rf "${OUT:?}"/*; touch "$OUT/.cli_snapshot"
W=$(mktemp -d)
mask() { sed -E 's/[0-9]+\.[0-9]+ ?(s|ms|seconds)\b/T\1/g; s/"(seconds|eval_seconds|user_seconds|wall_seconds|tuned|fp32|ms|spread|mean|median)": [0-9.e+-]+/"\1": T/g; s/[0-9]+\.[0-9]+s\b/Ts/g' ; }
run() { name=$1; shift; "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"; echo "rc=$?" >> "$OUT/$name.out"; mask < "$OUT/$name.out" > "$OUT/$name.o2"; mv "$OUT/$name.o2" "$OUT/$name.out"; mask < "$OUT/$name.err" > "$OUT/$name.e2"; mv "$OUT/$name.e2" "$OUT/$name.err"; }
export COLUMNS=120
run help mpt --help
for c in tune inspect check presets; do run help_$c mpt $c --help; done
run presets mpt presets
run presets_lower mpt presets torch-cpu --lists-only lower
run inspect_cnn mpt inspect examples/digits_cnn.py
run inspect_top mpt inspect examples/digits_cnn.py --preset hmp --top 20
run inspect_json mpt inspect examples/digits_transformer.py --json
run tune_sensor mpt tune examples/digits_sensor.py --dtype bf16 --out "$W/sensor" --no-latency
run tune_cnn mpt tune examples/digits_cnn.py --dtype bf16 --out "$W/cnn" --tolerance 0.002 --no-latency
run check_sensor mpt check "$W/sensor"
run check_json mpt check "$W/sensor" --json
run tune_cfg mpt tune --config configs/digits_sensor.yaml --out "$W/cfg" --no-latency
run bad_tol mpt tune examples/digits_sensor.py --tolerance 2 --out "$W/bad"
run bad_both mpt tune examples/digits_sensor.py --resume --overwrite --out "$W/bad"
run bad_dtype mpt tune examples/digits_sensor.py --dtype int8 --out "$W/bad"
run bad_evals mpt tune examples/digits_sensor.py --max-evals 1 --out "$W/bad"
for d in sensor cnn; do
  for f in plan.yaml lower_precision_ops.txt fp32_ops.txt report.md; do mask < "$W/$d/$f" | sed -E "s#$W#W#g; s#$(pwd)#ROOT#g; s#checkpoint_sha256: [0-9a-f]+#checkpoint_sha256: SHA#; s#written [0-9-]+ [0-9:]+ UTC#written DATE#; s#[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC#DATE#" > "$OUT/${d}_$f"; done
  python - "$W/$d/report.json" > "$OUT/${d}_report.json.keys" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def walk(x, p=""):
    if isinstance(x, dict):
        for k, v in sorted(x.items()): walk(v, f"{p}.{k}")
    elif isinstance(x, list):
        print(p, "list", len(x))
        for i, v in enumerate(x[:50]): walk(v, f"{p}[{i}]")
    else:
        skip = any(s in p for s in ("seconds", "latency", "ms", "created", "sha", "digest", "spread", "versions"))
        print(p, type(x).__name__, "" if skip else x)
walk(d)
PY
sed -i -E "s#$(pwd)#ROOT#g; s#(sha256|checkpoint_sha256)\b(.*) str [0-9a-f]+#\1\2 str SHA#" "$OUT/${d}_report.json.keys"
done
sed -i -E "s#$W#W#g; s#$(pwd)#ROOT#g; s#written [0-9-]+ [0-9:]+ UTC#written DATE#; s#checkpoint_sha256: [0-9a-f]+#checkpoint_sha256: SHA#" "$OUT"/*
sed -i -E "s#written [0-9-]+ [0-9:]+ UTC#written DATE#; s#[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC#DATE#" "$OUT"/*
rm -rf "$W"
