"""The chaos suite: adversarial campaigns against rlwire's promises (docs/reliability.md).

``python3 tasks.py chaos`` runs every campaign at full size and prints a table of outcomes;
``tests/test_chaos_sample.py`` runs a small sample of each in CI.
"""
