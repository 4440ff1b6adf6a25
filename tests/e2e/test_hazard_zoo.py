"""benchmarks/hazard_zoo.py's harness on its tiniest cases: the split, the range rule, the measured error of an
op alone, the honesty check and the exhaustive best known plan (the benchmark itself is not run here)."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "hazard_zoo.py"


def _zoo():
    spec = importlib.util.spec_from_file_location("mpt_bench_hazard_zoo", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_split_holds_out_half_of_the_hazards_of_both_dtypes():
    zoo = _zoo()
    design, heldout = ({p.stem for p in zoo.case_files(s)} for s in ("design", "heldout"))
    assert design and heldout and not design & heldout
    assert design | heldout == {p.stem for p in zoo.case_files("all")}
    for half in (design, heldout):
        assert {zoo.setting(zoo.CASES / f"{n}.py", "dtype") for n in half} == {"fp16", "bf16"}


@pytest.mark.plan
def test_range_rule_alone_errors_honesty_and_best_known_on_the_mlp_chain():
    zoo = _zoo()
    mod = zoo.load_case(zoo.CASES / "fp16_mlp_chain.py")
    lab = zoo.Lab(mod.build_model, mod.evaluate, mod.example_inputs, zoo.TuneOptions(**mod.TUNE))
    ranged = {lab.found.instances[n].label() for n in zoo.range_instances(lab, "fp16")}
    assert ranged == {"up:linear#0", "down:linear#0"}  # the producer past 65504 and the consumer it feeds
    alone = zoo.alone_errors(mod, list(lab.found.instances), ["down:linear#0", "out.5:linear#0"])
    # on any CPU: down overflows fp16, out.5 alone is off by 3.5e-4, 30 times below the bound
    assert alone["down:linear#0"] == math.inf and 0 < alone["out.5:linear#0"] < 0.01
    report = {"fp32_instances": ["down:linear#0", "out.5:linear#0"],
              "scores": {"down:linear#0": 0.0, "out.5:linear#0": alone["out.5:linear#0"] / 5}}
    assert [x.split(":")[0] for x in zoo.dishonest(report, alone)] == ["down"]


@pytest.mark.plan
def test_exhaustive_best_known_on_the_control():
    zoo = _zoo()
    row = zoo.Row("control", "design", "bf16")
    zoo.best_known(zoo.load_case(zoo.CASES / "control.py"), None, row)
    assert row.units == 3 and row.best == 1.0 and row.best_how.startswith("exhaustive (8)")
    assert row.range_passes and row.range_share == 1.0


def test_the_fallback_chain_columns_on_the_mlp_chain(tmp_path):
    """Issue 46: the chain's tune ends with every FLOP in 16-bit where the FP32-fallback plan keeps the chain
    FP32 (64.6%), and that plan's FP32 ops hold in bf16."""
    zoo = _zoo()
    path = zoo.CASES / "fp16_mlp_chain.py"
    row = zoo.Row("fp16_mlp_chain", "design", "fp16", candidates=7, evals=3, share=0.646)
    fp32 = [zoo._instance("up:linear#0"), zoo._instance("down:linear#0")]
    zoo.chain_case(zoo.load_case(path), path, tmp_path, fp32, row)
    assert row.chain_share == 1.0 and row.chain_evals == 3 and row.holds and row.chain_ok()


def test_a_case_whose_package_is_missing_is_skipped_with_its_reason(tmp_path):
    """A case that needs an optional package (minilm_spread_real: the zoo extra) sets SKIP where it is absent:
    its row runs nothing, counts no target and says what it needs."""
    zoo = _zoo()
    case = tmp_path / "needs_pkg.py"
    case.write_text('TUNE = {"dtype": "bf16", "tolerance": 1e-5}\nSPLIT = "design"\n'
                    'SKIP = "needs the `nowhere` package"\n')
    row = zoo.run_case(case, work=tmp_path)
    assert row.skipped == "needs the `nowhere` package" and row.evals is None
    assert all(v is None for v in row.verdicts().values())
    text = zoo.render([row])
    assert "needs_pkg: skipped: needs the `nowhere` package" in text and "0 of 0 targets PASS" in text
