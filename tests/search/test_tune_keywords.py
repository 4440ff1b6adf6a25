"""`tuner.tune(build, evaluate, tolerance=..., dtype=...)`: TuneOptions' fields as keyword options."""
import pytest

import tuner
from tuner.core.errors import ConfigError
from tuner.testing import PlantedTask


def test_keyword_options_reach_the_search():
    task = PlantedTask(8, 1, samples=128)
    result = tuner.tune(task.build, task.evaluate, task.example_inputs, dtype="float16", tolerance=0.25,
                        max_evals=3)
    assert result.plan.dtype == "fp16" and result.evals <= 3
    assert result.target == pytest.approx(result.baseline * 0.75)


def test_options_object_or_keywords_not_both():
    task = PlantedTask(4, 1, samples=64)
    with pytest.raises(TypeError, match="not both"):
        tuner.tune(task.build, task.evaluate, options=tuner.TuneOptions(), tolerance=0.1)
    with pytest.raises(TypeError, match="'tolerence'.*its options: dtype, preset, tolerance"):
        tuner.tune(task.build, task.evaluate, tolerence=0.1)
    with pytest.raises(TypeError, match="options must be a TuneOptions"):
        tuner.tune(task.build, task.evaluate, None, {"tolerance": 0.1})
    with pytest.raises(ConfigError, match="tolerance"):  # a keyword is checked as the option it is
        tuner.tune(task.build, task.evaluate, tolerance=2)
    assert task.evaluations == 0  # refused before anything ran


def test_tune_options_by_position_is_a_clear_type_error():
    with pytest.raises(TypeError, match=r"by name, not by position: found 'bf16', 0\.01; write e\.g\. "
                                        r"TuneOptions\(dtype='bf16'\)"):
        tuner.TuneOptions("bf16", 0.01)
    assert tuner.TuneOptions(dtype="bf16", tolerance=0.01).tolerance == 0.01
