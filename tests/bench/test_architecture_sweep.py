"""`bench/architecture_sweep.py`'s own logic: tiny configs and the error line it keeps (the sweep is not in CI)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.scripts import load_bench_script


def _sweep() -> ModuleType:
    return load_bench_script("architecture_sweep")


def test_tiny_configs_shrink_whatever_names_a_family_uses() -> None:
    sweep = _sweep()
    llama = sweep.tiny_config("llama")
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads, llama.vocab_size) == (64, 2, 4, 4160)
    gpt2 = sweep.tiny_config("gpt2")  # n_embd, n_layer, n_head
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head, gpt2.n_positions) == (64, 2, 4, 128)
    mixtral = sweep.tiny_config("mixtral")
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok) == (4, 2)
    # Derived fields follow: the config's own __init__ ran with the small numbers.
    gemma2 = sweep.tiny_config("gemma2")
    assert len(gemma2.layer_types) == gemma2.num_hidden_layers == 2


def test_special_token_ids_beyond_the_shrunk_vocabulary_become_the_embedded_tokenizers() -> None:
    """phi3's pad id 32000 made transformers refuse the shrunk model (padding_idx out of range): "not built"."""
    from transformers import AutoModelForCausalLM

    phi3 = _sweep().tiny_config("phi3")
    assert (phi3.vocab_size, phi3.bos_token_id, phi3.eos_token_id, phi3.pad_token_id) == (4160, 1, 1, 2)
    assert type(AutoModelForCausalLM.from_config(phi3)).__name__ == "Phi3ForCausalLM"
    assert _sweep().tiny_config("llama").bos_token_id == 1  # already in range: kept


def test_the_kept_error_is_the_ranks_not_torchruns() -> None:
    sweep = _sweep()
    output = "\n".join(
        [
            "[rank1]: Traceback (most recent call last):",
            "[rank1]: AttributeError: 'MambaConfig' object has no attribute 'num_attention_heads'",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        ]
    )
    rank_error = "[rank1]: AttributeError: 'MambaConfig' object has no attribute 'num_attention_heads'"
    assert sweep.last_error(output) == rank_error
    refused = "noise\nfsdp-train: model: cannot find the decoder layers of X\nChildFailedError: y"
    assert sweep.last_error(refused) == "fsdp-train: model: cannot find the decoder layers of X"


def test_a_model_the_shrink_leaves_huge_is_not_built_instead_of_exhausting_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blt's hash embeddings (fields the shrink did not know) built 4.6 G parameters: the kernel killed the sweep.

    The shrink knows them now (blt builds at 1.6 M); the guard stays for the next such fields, here with a
    bound a tiny llama is over."""
    sweep = _sweep()
    monkeypatch.setattr(sweep, "MAX_PARAMS", 1000)
    with pytest.raises(sweep.TooLarge, match=r"^[\d,]+ parameters after the shrink .* over 1,000$"):
        sweep.build("llama", tmp_path)
    assert not any(tmp_path.iterdir())  # counted on the meta device, nothing built or saved


def test_latent_attention_sizes_shrink_together_so_deepseek_v3_builds() -> None:
    """deepseek_v3's rotary and latent sizes were left large beside a 64-wide model: transformers' own forward
    failed ("not built"). They are scaled by one factor now, their sums and ratios kept."""
    c = _sweep().tiny_config("deepseek_v3")
    assert (c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank, c.q_lora_rank) == (8, 16, 16, 64, 192)
    assert c.head_dim == c.qk_rope_head_dim  # transformers' rotary embedding reads head_dim


def test_a_shrunk_config_transformers_itself_cannot_run_is_not_built(tmp_path: Path) -> None:
    """git's loss skips the image positions it expects before the text: transformers' own forward fails on text
    alone, which says nothing of the trainer."""
    result, config = _sweep().build_and_check("git", tmp_path / "git")
    assert (result.outcome, config) == ("not built", None)
    assert result.detail.startswith("ValueError: Expected input batch_size (0) to match target batch_size")
