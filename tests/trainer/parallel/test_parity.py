"""FSDP2 on 2 CPU ranks trains exactly like one process without FSDP.

Every sharding strategy (and activation checkpointing, with explicit prefetch and op-level)
runs 20 fp32 steps with gradient accumulation on the same global batches as
a single non-sharded process; losses, gradient norms and validation losses
must agree step by step. The same runs show that ranks read disjoint data,
that validation never sees training documents, and that ``full`` keeps half
the parameter and optimizer bytes per rank that ``no_shard`` does.
"""

from __future__ import annotations

import math
import re

import pytest
from fsdp_trainer.data.sources import holdout_mask

from tests.trainer.harness import VARIANTS, ParityRuns

pytestmark = pytest.mark.slow

STEPS = 20
MESH = {
    "full": "{'shard': 2}",
    "shard_grad_op": "{'shard': 2}",
    "no_shard": "{'replicate': 2, 'shard': 1}",
    "hybrid_2x1": "{'replicate': 2, 'shard': 1}",
    "hybrid_1x2": "{'replicate': 1, 'shard': 2}",
    "full_ac_prefetch": "{'shard': 2}",
    "full_ac_op": "{'shard': 2}",
}


def _doc(sample_id: str) -> int:
    return int(re.match(r"e\d+/d(\d+)@", sample_id).group(1))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_losses_match_the_single_process_reference(parity_runs: ParityRuns, variant: str) -> None:
    ref, run = parity_runs.get("reference"), parity_runs.get(variant)
    assert f"device mesh {MESH[variant]}" in run.output
    ref_loss, loss = ref.losses(), run.losses()
    assert sorted(loss) == list(range(1, STEPS + 1))
    worst = max(abs(loss[s] - ref_loss[s]) for s in ref_loss)
    assert worst <= 1e-4, f"largest loss difference {worst:.2e}"
    # It learned something, so the comparison is not of two flat lines.
    assert ref_loss[STEPS] < ref_loss[1] - 0.3
    # Every rank reports the same global mean loss.
    assert run.losses(1) == loss


@pytest.mark.parametrize("variant", ["full", "hybrid_2x1"])
def test_gradient_norm_is_the_global_one(parity_runs: ParityRuns, variant: str) -> None:
    ref = {r["step"]: r["grad_norm"] for r in parity_runs.get("reference").events("step")}
    run = {r["step"]: r["grad_norm"] for r in parity_runs.get(variant).events("step")}
    # Clipping at 1.0 is active: a per-shard norm would be about 1/sqrt(2) of these.
    assert max(ref.values()) > 1.0
    for step in ref:
        assert run[step] == pytest.approx(ref[step], rel=1e-4, abs=1e-6)


def test_ranks_read_disjoint_data_that_make_up_the_global_batch(parity_runs: ParityRuns) -> None:
    ref, run = parity_runs.get("reference"), parity_runs.get("full")
    steps0, steps1 = run.events("step", 0), run.events("step", 1)
    docs0 = {_doc(s) for r in steps0 for s in r["samples"]}
    docs1 = {_doc(s) for r in steps1 for s in r["samples"]}
    assert len(docs0) == STEPS * 4 and len(docs1) == STEPS * 4
    assert not docs0 & docs1
    for r_ref, r0, r1 in zip(ref.events("step"), steps0, steps1, strict=True):
        assert sorted(r_ref["samples"]) == sorted(r0["samples"] + r1["samples"])


def test_validation_reports_a_loss_on_held_out_documents(parity_runs: ParityRuns) -> None:
    ref, run = parity_runs.get("reference"), parity_runs.get("full")
    evals = run.events("eval")
    assert [e["step"] for e in evals] == [10, 20]
    for e in evals:
        assert 0 < e["loss"] < math.log(256) + 0.5
        assert e["perplexity"] == pytest.approx(math.exp(e["loss"]))
        assert e["batches"] == 2
    # Same held-out windows evaluated by 1 or 2 ranks: the same number.
    for e_ref, e in zip(ref.events("eval"), evals, strict=True):
        assert e["loss"] == pytest.approx(e_ref["loss"], abs=1e-4)
    assert evals[1]["loss"] < evals[0]["loss"]
    held_out = {i for i, h in enumerate(holdout_mask(500)) if h}
    trained = {_doc(s) for rank in (0, 1) for r in run.events("step", rank) for s in r["samples"]}
    assert len(held_out) == 10
    assert not held_out & trained


def test_full_sharding_halves_parameter_and_optimizer_bytes(parity_runs: ParityRuns) -> None:
    (full,) = parity_runs.get("full").events("memory", 0)
    (full1,) = parity_runs.get("full").events("memory", 1)
    (repl,) = parity_runs.get("no_shard").events("memory", 0)
    num_params = parity_runs.get("full").events("start")[0]["num_params"]
    # no_shard: the whole fp32 model, and AdamW's two moments (plus step counters).
    assert repl["param_bytes"] == 4 * num_params
    assert 2 * repl["param_bytes"] <= repl["optim_bytes"] <= 2 * repl["param_bytes"] + 1024
    replicated = repl["param_bytes"] + repl["optim_bytes"]
    for rank in (full, full1):
        ratio = (rank["param_bytes"] + rank["optim_bytes"]) / replicated
        assert 0.45 <= ratio <= 0.55, ratio
    assert full["param_bytes"] + full1["param_bytes"] == repl["param_bytes"]
