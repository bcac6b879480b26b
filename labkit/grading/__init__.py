"""Graded exercises: check helpers, the plan checker, code run on real ranks, local submit.

* ``checks``: convert answers to plain numbers / tensors, then compare; ``Verdict`` feedback
* ``numeric``: answer keys (from ``labkit.theory``) and checks for problem set 1
* ``plan_checker``: is a parallelism plan feasible? (memory, bubble, TP inside a node)
* ``code_checks`` / ``plan_code``: student code graded on N real ranks / a 1F1B plan
* ``course``, ``submit``, ``cli``: the nbgrader course in the repo and ``labkit submit``
* ``feedback``: the preprocessor that keeps hidden tests out of the feedback HTML

Importing this package never imports torch.
"""

from labkit.grading.checks import Verdict, as_number, check_number, require

__all__ = ["Verdict", "as_number", "check_number", "require"]
