"""One rank: the ``RankContext`` strategies receive and the process group a job runs in.
"""
