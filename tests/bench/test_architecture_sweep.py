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


def test_a_model_the_shrink_leaves_huge_is_not_built_instead_of_exhausting_memory(tmp_path: Path) -> None:
    """blt's hash embeddings (fields the shrink does not know) built 4.6 G parameters: the kernel killed the sweep."""
    sweep = _sweep()
    with pytest.raises(sweep.TooLarge, match=r"^4,637,121,280 parameters after the shrink"):
        sweep.build("blt", tmp_path)
    assert not any(tmp_path.iterdir())  # counted on the meta device, nothing built or saved


def test_a_shrunk_config_transformers_itself_cannot_run_is_not_built(tmp_path: Path) -> None:
    """deepseek_v3's shrunk rotary sizes break transformers' own forward: that was counted as the trainer failing."""
    result, config = _sweep().build_and_check("deepseek_v3", tmp_path / "deepseek_v3")
    assert (result.outcome, config) == ("not built", None)
    assert result.detail.startswith("RuntimeError: The size of tensor a (32) must match the size of tensor b (8)")
