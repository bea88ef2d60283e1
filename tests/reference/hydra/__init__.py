# Vendored verbatim (below this header) from zankner/Hydra at 3f39fbd2c22552e788b62dfd29a12b07ad63abfe,
# hydra/__init__.py (Hydra, Ankner et al., arXiv 2402.05109). Licensed under the Apache License,
# Version 2.0 (LICENSE beside this package; http://www.apache.org/licenses/LICENSE-2.0).
# A test oracle only: tests/test_parity_hydra.py loads it by file path (README.md).

