"""Graded exercises: check helpers, per-part scoring, the sandboxed autograder, local submit.

* ``checks``: convert answers to plain numbers / tensors, then compare; ``Verdict`` feedback
* ``parts``: ``Question``: partial credit part by part, gates, "checked at grading"
* ``calls``: call a student's function here or in the grading box, watched for calls into
  labkit's own answer (``labkit.theory``, ``labkit.schedules``, labkit's implementations)
* ``numeric``: problem set 1's visible cases and parts (keys: instructor side)
* ``plan_checker``: is a parallelism plan feasible? (memory, bubble, TP inside a node)
* ``code_checks``, ``sync_checks``, ``rank_checks``, ``rank_side``: student code on real
  ranks (recursive-doubling all-reduce, accumulation with no_sync; ``zero_checks``: ZeRO-1
  with Adam); ``plan_code``: a hand-written 1F1B plan
* ``layout3d``: problem set 5 (a GPT's model state per rank, a 3D layout under a budget)
* ``async_ps``: problem set 6 (the SSP gate, a straggler's effects, Ray's by-value pitfall)
* ``reasoning``, ``traces``: problem set 4 (strategy choice, the mini challenge, reading
  recorded timelines) and the recorder of its traces
* ``sandbox``: where autograding runs the student's code (a box) and how the checks reach it
* ``instructor``: loads the instructor-only data in ``solutions/_grading/``
* ``course``, ``submit``, ``cli``: the nbgrader course in the repo and ``labkit submit``
* ``feedback``: the preprocessor that keeps hidden tests out of the feedback HTML

Importing this package never imports torch.
"""

from labkit.grading.checks import Verdict, as_number, check_number, require

__all__ = ["Verdict", "as_number", "check_number", "require"]
