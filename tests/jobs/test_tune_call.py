"""`tuner.tune(...)` from Python: progress lines (progress=False: none) and `out=` writing the CLI's outputs."""
import re
import runpy
import textwrap

import pytest
import torch
import yaml

import tuner
from tuner.core.output_files import COMMITTED, HMP_FP16_NAME, SHARDED_CHECKPOINT_NAME
from tuner.testing import PlantedTask


def test_progress_shows_each_trial_and_false_silences(capsys):
    task = PlantedTask(8, 1, samples=128)
    result = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002)
    shown = capsys.readouterr().out
    lines = re.findall(r"^eval +(\d+) +(base|pass|FAIL) ", shown, flags=re.M)
    assert [int(n) for n, _ in lines] == [t.n for t in result.trials]
    assert [v == "FAIL" for _, v in lines] == [not t.passed for t in result.trials]
    assert "baseline 1.000; target >= 0.9980" in shown  # the trial lines' digits, trailing zeros kept
    last = shown.strip().splitlines()[-1]  # the closing line says the outcome, as the CLI's does
    assert last.startswith(f"target met: baseline 1.000 -> tuned 1.000 (target 0.9980), trial {result.chosen}; ")
    assert last.endswith(f"; {len(result.plan.fp32_instances)} of {len(result.candidates)} op instances in FP32; "
                         f"{result.evals} evaluations")
    assert repr(result) == (f"TuneResult(status=MET, baseline=1, metric=1, target=0.998, evals={result.evals}, "
                            f"chosen={result.chosen}, fp32={len(result.plan.fp32_instances)} of "
                            f"{len(result.candidates)} op instances, dtype='bf16')")
    again = tuner.tune(task.build, task.evaluate, task.example_inputs, tolerance=0.002, progress=False)
    assert capsys.readouterr().out == "" and again.plan == result.plan


def test_out_writes_what_the_cli_writes_and_load_reads_it(tmp_path, capsys):
    task = PlantedTask(8, 1, samples=128)
    model = task.build()
    result = tuner.tune(model, task.evaluate, task.example_inputs(), tolerance=0.002, out=tmp_path / "o",
                        progress=False)
    assert all((tmp_path / "o" / name).is_file() for name in COMMITTED  # (bf16: no fp16 HMP list)
               if name not in (SHARDED_CHECKPOINT_NAME, HMP_FP16_NAME))
    plan = tuner.Plan.load(tmp_path / "o")
    assert plan.fp32_instances == result.plan.fp32_instances and plan.model.file.endswith("testing.py")
    loaded = tuner.load(task.build(), tmp_path / "o")
    x = task.example_inputs()[0]
    assert torch.equal(loaded(x), tuner.load(task.build(), result.plan)(x))
    assert task.evaluate(loaded) == result.metric
    assert capsys.readouterr().out == ""


def test_out_from_a_script_or_notebook_records_no_model_file_and_names_the_python_keywords(runner, tmp_path):
    """Functions defined in `__main__` (a notebook cell, a script): the plan records no model file, so `mpt check`
    asks for one (exit 2) instead of importing the script, which would tune all over again; the same call
    repeated is refused with the keywords that fix it, as tune() spells them."""
    from mpt_cli import exitcodes
    from tests.cli.test_bad_input import assert_error, mpt

    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent(f"""
        import tuner
        from tuner.testing import PlantedTask

        task = PlantedTask(8, 1, samples=64)


        def build_model():
            return task.build()


        result = tuner.tune(build_model, task.evaluate, task.example_inputs, tolerance=0.002,
                            out={str(tmp_path / "o")!r}, progress=False)
        """))
    runpy.run_path(str(script), run_name="__main__")
    ref = yaml.safe_load((tmp_path / "o" / "plan.yaml").read_text())["model"]
    assert "file" not in ref and ref["structure"] and ref["weights"]
    with pytest.raises(tuner.ConfigError, match=r"already holds a run .*; pass resume=True to continue it or "
                                                r"overwrite=True to replace it$"):
        runpy.run_path(str(script), run_name="__main__")
    res = mpt(runner, "check", tmp_path / "o")
    err = assert_error(res, exitcodes.USAGE, "--model: the plan in", "was made by tuner.tune() in a notebook or a "
                       "script, with no model file", "--model MODEL.py")
    assert len(err.strip().splitlines()) == 1
