"""Training and validation data: documents -> tokens -> fixed-length packed windows.

- ``files.py``: ``data.path`` (file, directory, glob) into typed files.
- ``corpus.py``: the embedded corpus (prose every Python install carries).
- ``tokenizer.py``: the tokenizer, and the embedded byte-level BPE.
- ``sources.py``: opening datasets, the validation hold-out, each rank's
  resumable stream of documents.
- ``formats/``: one class per ``data.format`` (columns, checks, rows ->
  ``Document``), found by name in a registry.
- ``packing.py``: documents concatenated and cut into windows; ``Batch``.
- ``sft.py``: whole rows packed into padded sequences (the row formats).
- ``loader.py``: ``TrainData`` (this rank's training batches, resumable) and
  the fixed validation batches.
- ``prefetch.py``: ``PrefetchedData``, the next batches made on a thread.

Importing the package imports nothing heavy: the config checks use ``files``
and ``formats`` without torch or datasets.
"""
