"""report.json: the whole outcome for scripts; it embeds the plan's own dict, so the two cannot disagree."""
from __future__ import annotations

import json
from typing import Any

from tuner.engine.native import Execution
from tuner.report.outcome import TuneReport
from tuner.search.phases import Phase
from tuner.search.results import Trial, TuneResult

REPORT_VERSION = 1


def report_json(result: TuneResult, report: TuneReport) -> str:
    """The text of report.json."""
    return json.dumps(report_dict(result, report), indent=1, default=str) + "\n"


def report_dict(result: TuneResult, report: TuneReport) -> dict[str, Any]:
    """report.json's content, keys in the order they are written."""
    plan = report.plan
    return {
        "version": REPORT_VERSION,
        "created": report.created or None,
        "status": result.status.value,
        "stopped": result.stopped.value if result.stopped else None,
        "dtype": plan.dtype,
        "preset": plan.preset,
        "baseline_metric": result.baseline,
        "noise": result.noise,
        "target": result.target,
        "final_metric": result.metric,
        "evaluations": result.evals,
        "rebuilds": result.rebuilds,
        "notes": result.notes,
        "warnings": list(report.warnings),
        "candidates": len(result.candidates),
        "fp32_instances": [i.label() for i in plan.fp32_instances],
        "fallback_instances": [i.label() for i in plan.fallback_instances],  # in plan.fallback (a fallback chain)
        **report.shares.to_dict(),
        "chosen_trial": result.chosen,
        "latency_ms": report.latency.to_dict() if report.latency is not None else None,
        "checkpoint": report.checkpoint.to_dict() if report.checkpoint is not None else None,
        "seconds": {"total": result.seconds + report.seconds, "evaluations": result.eval_seconds,
                    "user_code": result.user_seconds, "phases": _phases(result, report)},
        "scores": result.scores,
        "scores_estimated": sorted(result.estimated),  # the rest were measured with that op alone low
        "range_kept": result.range_kept,  # label -> why the range rule kept it FP32 before the search
        "plan": plan.to_dict(),
        "trials": [_trial(t) for t in report.trials],
        "execution": _execution(report.execution),
        "op_lists": _op_lists(report),
    }


def _op_lists(report: TuneReport) -> dict[str, Any] | None:
    """The list files' plan: the op types it keeps FP32 everywhere though the plan runs them low somewhere
    (`mixed`), and its measured lower-precision FLOP share (not evaluated); None when not measured."""
    lists = report.lists
    if lists is None:
        return None
    share = lists.list_shares.flop_share if lists.list_shares is not None else None
    return {"exact": lists.exact, "mixed": list(lists.mixed), "low_precision_flop_share": share,
            "raised": lists.raised or None, "fallback": list(lists.fallback)}


def _trial(t: Trial) -> dict[str, Any]:
    return {"n": t.n, "label": t.label, "fp32": list(t.fp32), "metric": t.metric, "passed": t.passed,
            "baseline": t.baseline, "seconds": t.seconds, "low_precision_flop_share": t.shares.flop_share,
            "error": t.error, "from_journal": t.from_journal, "fp32_recorded": t.kept, "fallback": list(t.fallback),
            "loss_scaler": t.scaler.to_dict() if t.scaler is not None else None,
            **({"seeds": list(t.seeds)} if t.seeds else {})}  # --seeds: each training run's metric


def _execution(ex: Execution) -> dict[str, Any]:
    return {"path": ex.path.value, "summary": ex.describe(), "fp32_islands": list(ex.fp32_islands),
            "fp32_subtrees": list(ex.fp32_subtrees), "python_modules": list(ex.python_modules),
            "unfused": list(ex.unfused), "unnested": list(ex.unnested)}


def _phases(result: TuneResult, report: TuneReport) -> dict[str, dict[str, float]]:
    """Seconds by phase (`tuner.search.phases`): mpt's own and inside evaluate, the report's measuring and
    writing (the checkpoint with its read-back check) last."""
    table = result.phases.table() if result.phases is not None else {}
    table[Phase.REPORT.value] = {"own": round(report.seconds, 4), "evaluate": 0.0}
    return table
