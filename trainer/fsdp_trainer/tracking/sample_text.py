"""training.samples as text: one Markdown table per step, for the trackers that show text."""

from __future__ import annotations

from .background import SampleRows

SAMPLES_TAG = "samples"


def markdown_table(step: int, rows: SampleRows) -> str:
    """The samples as one Markdown table (TensorBoard's text plugin and MLflow's artifact view render it)."""

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>") or " "

    body = "\n".join(f"| {cell(prompt)} | {cell(completion)} |" for prompt, completion in rows)
    return f"Samples at step {step}\n\n| prompt | completion |\n| --- | --- |\n{body}\n"


def artifact_name(step: int) -> str:
    """Where a step's samples go in a run's artifacts (MLflow)."""
    return f"{SAMPLES_TAG}/step-{step:08d}.md"
