"""The model: built on the meta device, initialised or loaded from pretrained weights.

- ``llama.py``: the ``LlamaConfig`` of a preset, the meta-device model,
  materialisation and seeded weight init, rotary buffers.
- ``pretrained.py``: Hugging Face safetensors streamed into the shards.
- ``hub.py``: local paths versus hub ids, hub snapshots.
- ``lora.py``: LoRA adapters (``spec.peft``) put into the meta model, the base frozen.
- ``param_names.py``: canonical parameter names, whatever wrappers were applied.
- ``shards.py``: a full tensor into this rank's piece of a (sharded) parameter.

Importing the package imports nothing heavy: the config checks use ``hub``
without torch.
"""
