"""The decoding engine: draft trees, sampling, lossless verification and the decode loop.
Token ids and tensors only; it never imports UI or plotting libraries."""
