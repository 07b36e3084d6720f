"""``kvbench paper``: the lecture's and the vLLM paper's numbers, reproduced by kvbench's closed
forms and by kvbench runs, with a computed verdict per number (see :mod:`kvbench.studies.paper.rows`)."""
