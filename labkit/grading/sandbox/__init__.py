"""Grading in a box: the student's code runs sandboxed, the checks run outside it.

* ``box``: the sandbox (bubblewrap, else ``unshare`` namespaces, else a plain child) and
  the JSON pipe to the process inside it;
* ``server``: what runs inside: the student's cells, their functions on request;
* ``wire``: the only shapes a value may take when it crosses (plain data, never pickles);
* ``watch``: inside the box, which forbidden labkit functions and which c10d operators a
  student's function used;
* ``remote``: the grader's side of a session: proxies for the student's functions, the
  per-cell time limit, a fresh box (and a replay of the cells before) after a hang;
* ``execute``: the nbgrader preprocessor that replaces nbgrader's ``Execute``: student
  cells in the box, the locked test cells in the grader's own interpreter.

``docs/instructors.md`` says what each sandbox mode does and does not protect.
"""
