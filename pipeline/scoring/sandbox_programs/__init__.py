"""The HumanEval sandbox's programs, as modules the linter reads (run by ``pipeline.scoring.humaneval``,
never imported): ``server.py`` inside the sandbox, ``checker.py`` outside it, ``codec.py`` inlined in both."""
