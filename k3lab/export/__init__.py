"""Exporting a trial's checkpoint: `hugging_face.py` (a Kimi Linear checkpoint for `transformers`)."""
