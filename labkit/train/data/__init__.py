"""The lab's datasets: nothing is downloaded, everything is seeded and identical on every rank.

* ``synthetic``: a classification task labelled by a fixed random "teacher" MLP (the lessons'
  default: instant, any size);
* ``text``: characters (or the most frequent word pieces) of Python's own standard-library
  source files, for the small GPT: every machine that runs labkit has them;
* ``digits``: the UCI 8x8 handwritten digits (1,797 images shipped inside the
  package), for a classifier whose accuracy means something;
* ``activations``: random activations and targets for transformer blocks alone (lesson 04).

Every task is a ``Task``: ``batch(step, global_batch, shard, shards)`` returns data rank
``shard``'s contiguous slice of step ``step``'s global batch, a fixed slice of a seeded
permutation of the training set (a new permutation every epoch). Because every rank takes an
equal slice and averages its own loss, averaging gradients over ranks gives exactly the
gradient of the global batch.
"""

from labkit.train.data.activations import ActivationTask
from labkit.train.data.base import Task
from labkit.train.data.digits import DigitsTask
from labkit.train.data.synthetic import SyntheticTask
from labkit.train.data.text import TextTask

__all__ = ["ActivationTask", "DigitsTask", "SyntheticTask", "Task", "TextTask"]
