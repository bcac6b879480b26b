"""Grading in a box: the student's code runs sandboxed, the checks run outside it.

* ``box`` / ``modes`` / ``boxinit``: the sandbox (bubblewrap, else ``unshare`` namespaces,
  else a plain child), its command line, and its own first process (rlimits, not
  traceable, the reaper); ``pipe``: the JSON pipe to the process inside it;
* ``limits`` / ``procfs`` / ``budget``: what a box may use (processes, memory, ``/tmp``,
  CPU per cell and per notebook), how it is enforced (cgroup, rlimits) and read from
  outside, and the line a cell's output gets when a limit stopped it;
* ``server``: what runs inside: the student's cells, their functions on request;
* ``wire``: the only shapes a value may take when it crosses (plain data, never pickles);
* ``absent``: what stands in for a labkit module the graded part forbids (the box that
  runs that part does not contain the module at all);
* ``relay`` / ``relay_rank`` / ``rank_boxes`` / ``combine``: communication exercises, one
  box per rank with no process group, every message relayed and counted by the grader;
* ``watch``: calls into forbidden labkit functions, seen from inside (practice feedback);
* ``remote`` / ``proxy``: the grader's side of a notebook: its boxes, replays after a hang
  or a limit, proxies for the student's functions;
* ``execute``: the nbgrader preprocessor that replaces nbgrader's ``Execute``: student
  cells in the box, the locked test cells in the grader's own interpreter.

``docs/instructors.md`` says what each sandbox mode does and does not protect.
"""
