"""The Code-A1 method itself (docs/method.md §3-§10): prompts, response parsing, the execution plan of
one problem and its outcome matrix, both roles' rewards, the Mistake Book, GRPO, and one iteration's pure helpers.
"""
