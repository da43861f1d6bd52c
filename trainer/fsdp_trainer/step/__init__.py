"""One optimizer step's seam: how its micro-batches run forward and backward, and what its ranks exchange.

``forward_backward``: the strategy the parallel plan chooses (every row whole
in this process, or each row split over the context-parallel peers); a
schedule that runs the model in stages (pipelining) is a third. ``reductions``:
the step's values that cross ranks, each in a named slot of one collective.
``objective``: what a micro-batch's loss is and what it is divided by.
torchtitan splits its trainer the same way (``forward_backward_step`` beside
the loop, and a pipelined variant of it).
"""

from .forward_backward import ContextParallelStep, ForwardBackward, Objective, PlainStep, step_strategy
from .objective import StepObjective, build_objective
from .peers import non_finite_loss, wait_for_peers
from .reductions import StepReductions

__all__ = [
    "ContextParallelStep",
    "ForwardBackward",
    "Objective",
    "PlainStep",
    "StepObjective",
    "StepReductions",
    "build_objective",
    "non_finite_loss",
    "step_strategy",
    "wait_for_peers",
]
