"""draftc's training tools: data generation for speculative-decoding drafters.

Python is used here for training only; the compiler and runtime are Rust.
See tools/train/README.md.
"""

__version__ = "0.1.0"
