"""Inputs: deterministic, shardable tf.data pipelines of NestedMap batches.

- `base_input.BaseInputGenerator`: params, sharding by `tf.distribute.InputContext`,
  seeded shuffling, static batches, `Batches(n)` for tests and evaluation.
- `text_lm.TextLmInput`: byte-level language-model windows of English text.
- `seq2seq.Seq2SeqInput`: generated reverse / sort sequence-to-sequence examples.
- `image.DigitsInput, image.SyntheticImageInput`: the UCI 8x8 digits (shipped in
  `inputs/data/`), and synthetic images.
"""
