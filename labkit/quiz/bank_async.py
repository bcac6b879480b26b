"""Quiz questions: parameter servers and their consistency models (lesson 11), and Ray (lesson 12).

Parameter servers (Li et al. 2014): workers push gradients to servers and pull weights;
bulk-synchronous (BSP) waits for everyone each step, asynchronous (ASP) never waits, and
stale-synchronous parallel (SSP, Ho et al. 2013) lets the fastest worker run at most s
clocks ahead of the slowest; bounded delay (Li et al. 2014) instead bounds how many updates
stale a gradient may get, which is a different rule (``labkit run ps --consistency
bounded-delay``). Seed 000: asynchronous SGD is "faster on unreliable networks,
but may introduce stale gradients". Ray (Moritz et al. 2018; seed 003's orchestration
section): stateless tasks, stateful actors, and an object store whose references avoid
shipping the same large object to every task. Traffic is compared with the ring
(``theory.ring_allreduce_bytes``).
"""

from __future__ import annotations

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question, format_number
from labkit.theory import ring_allreduce_bytes

PS, RAY = Concept.PARAMETER_SERVER, Concept.RAY


def _server_gb(workers: int, size_gb: float) -> float:
    """Bytes through one parameter server per step: every worker pushes and pulls it all."""
    return 2 * workers * size_gb


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ parameter servers
    ChoiceQuestion(
        "ps-01", PS,
        "Which consistency model lets a fast worker run ahead of the slowest one, but only by "
        "a fixed number of steps?",
        "Stale-synchronous parallel (SSP)",
        ("Bulk-synchronous parallel (BSP)", "Fully asynchronous (ASP)",
         "Synchronous all-reduce data parallelism"),
        "BSP waits for every worker each step (a straggler stalls everyone); ASP never waits "
        "(gradients can be arbitrarily stale); SSP sits between: a worker at clock c may only "
        "proceed while the slowest worker is at c - s or later, so no two workers are ever "
        "more than s clocks apart (staleness counted in clocks, not in updates)."),
    NumericQuestion(
        "ps-02", PS,
        "Under SSP with staleness bound s = {s}, the slowest worker is working on clock {c}. "
        "What is the highest clock the fastest worker may be working on?",
        grid={"s": (1, 2, 3, 5), "c": (4, 10, 25)},
        compute=lambda s, c: c + s,
        explanation="A worker may start clock t only while the slowest worker is at t - s or "
        "later: t <= {c} + {s} = {answer}. Any faster worker waits there, so every gradient it "
        "applies is at most {s} clocks stale.",
        integer=True),
    ChoiceQuestion(
        "ps-07", PS,
        "Three equally fast workers, each step one time unit. What happens with SSP at "
        "staleness s = 0, and with bounded delay at K = 0 updates?",
        "SSP s = 0 paces like BSP (all three step together); bounded delay K = 0 runs them "
        "one at a time, three times slower",
        ("Both are BSP: zero staleness means every step waits for everyone",
         "Both run the workers one at a time, since nothing may be stale",
         "SSP s = 0 runs one worker at a time; bounded delay K = 0 paces like BSP"),
        "SSP bounds clocks (Ho et al. 2013): at s = 0 a worker at clock c waits until every "
        "worker reached c, which is BSP's barrier. Bounded delay bounds updates (Li et al. "
        "2014): at K = 0 no gradient may see another update slip in between its read and "
        "its push, so only one worker can hold a read at a time: sequential, 3 units per "
        "step instead of 1. labkit runs both: --consistency ssp --staleness s and "
        "--consistency bounded-delay --delay K."),
    NumericQuestion(
        "ps-03", PS,
        "Under BSP, {n} workers each take {fast} s per step but one straggler takes {slow} s. "
        "What fraction of the no-straggler throughput does the job get?",
        grid={"n": (4, 16, 64), "fast": (0.2, 0.5), "slow": (0.8, 1.0, 2.0)},
        compute=lambda n, fast, slow: fast / slow,
        explanation="BSP's step ends when the last worker pushes: {slow} s instead of {fast} s, "
        "so the throughput is {fast} / {slow} = {answer} of what it could be, whatever the "
        "number of workers. SSP or ASP let the others run on; backup workers are another cure.",
        valid=lambda n, fast, slow: slow > fast),
    NumericQuestion(
        "ps-04", PS,
        "One parameter server serves {workers} workers training a {size_gb} GB model; each step "
        "every worker pushes its full gradient and pulls the full weights. How many GB cross "
        "the server's link per step?",
        grid={"workers": (4, 8, 32), "size_gb": (0.5, 2.0)},
        compute=_server_gb,
        explanation="{workers} pushes plus {workers} pulls of {size_gb} GB = {answer} GB through "
        "one link, growing with the workers. A ring all-reduce makes each rank send "
        "2(n-1)/n x {size_gb} = {ring} GB, nearly constant: hence sharded servers, or no server.",
        unit="GB",
        derive=lambda workers, size_gb: {
            "ring": format_number(ring_allreduce_bytes(size_gb * 1e9, workers) / 1e9)}),
    ChoiceQuestion(
        "ps-05", PS,
        "Asynchronous SGD removes waiting. What does it cost?",
        "Stale gradients: updates computed on old weights can slow or destabilise training",
        ("Every worker must hold the whole dataset",
         "Twice the communication of synchronous SGD per step",
         "The learning rate can no longer be scaled with the batch"),
        "A worker's gradient was computed on weights that other workers have since changed. "
        "The staler it is, the more it points in an outdated direction; large staleness "
        "slows convergence or diverges, which is why SSP bounds it and many systems stay "
        "synchronous."),
    ChoiceQuestion(
        "ps-06", PS,
        "When is asynchronous or stale-synchronous training most attractive?",
        "Workers of uneven speed or an unreliable network, where waiting dominates",
        ("A single node of identical GPUs on NVLink",
         "Models too large to fit on one GPU",
         "Very small learning rates with no warmup"),
        "Seed 000: asynchronous SGD is faster on unreliable networks. When stragglers or "
        "variable links make everyone wait at each barrier, bounded staleness recovers the "
        "lost time; on a uniform fast node synchronous all-reduce costs little and keeps "
        "training deterministic."),
    # ------------------------------------------------------------ Ray
    ChoiceQuestion(
        "ray-01", RAY,
        "In Ray, what is the difference between a task and an actor?",
        "A task is a stateless remote function; an actor is a stateful object on one worker",
        ("A task runs on the GPU; an actor always runs on the CPU",
         "A task returns a value; an actor can only print",
         "Tasks always run inside the driver process that submitted them; only actors "
         "run remotely"),
        "Calling f.remote(x) on a @ray.remote function schedules a task anywhere there is "
        "capacity and returns a future. An actor is a class instance living on one worker "
        "and keeping state between method calls, the shape of a parameter server or a "
        "model replica."),
    ChoiceQuestion(
        "ray-02", RAY,
        "A hundred Ray tasks each need the same 2 GB model. What is the fix seed 003 calls "
        "the most common Ray pitfall?",
        "ray.put the model once and pass the object reference to every task",
        ("Pass the model to each task by value, so that every task gets its own private "
         "copy it can safely modify",
         "Make the model a global variable of the driver script",
         "Split the model into a hundred 20 MB pieces"),
        "Passed by value, the model is serialised and shipped once per task. Stored once in "
        "the object store with ray.put, only a small reference travels; tasks on a node read "
        "the same shared copy. Seed 003: the job then runs an order of magnitude faster."),
    NumericQuestion(
        "ray-03", RAY,
        "{tasks} Ray tasks each receive a {size_gb} GB model passed by value. How many GB are "
        "serialised and shipped, compared with {size_gb} GB once through ray.put?",
        grid={"tasks": (10, 100, 500), "size_gb": (0.5, 2.0, 8.0)},
        compute=lambda tasks, size_gb: tasks * size_gb,
        explanation="By value every call carries its own copy: {tasks} x {size_gb} = {answer} "
        "GB. By reference the object store holds one copy and each task gets a reference "
        "of a few bytes.",
        unit="GB"),
    ChoiceQuestion(
        "ray-04", RAY,
        "What does Ray Train add on top of PyTorch's DistributedDataParallel?",
        "It starts the worker processes and sets up DDP for you across the cluster",
        ("A new all-reduce algorithm faster than NCCL's ring",
         "Automatic model parallelism for models that do not fit",
         "Asynchronous SGD with a parameter server in place of DDP's synchronous "
         "all-reduce steps"),
        "Ray Train places one worker per GPU on the cluster, initialises the process group "
        "and wraps the model in DDP, then runs your training loop on each worker; the "
        "parallelism itself is still DDP's. labkit's Ray launcher runs the same rank code."),
    ChoiceQuestion(
        "ray-05", RAY,
        "What is Ray Tune for?",
        "Running many training trials in parallel to search hyperparameters",
        ("Tuning NCCL's buffer sizes and channel counts for the cluster's interconnect "
         "before training starts",
         "Compressing gradients before the all-reduce",
         "Balancing pipeline stages by measured time"),
        "Tune launches trials (each a training run with its own hyperparameters) as Ray "
        "tasks or actors, schedules them on free resources and can stop poor ones early; "
        "the same cluster that trains one model searches over many."),
    ChoiceQuestion(
        "ray-06", RAY,
        "What does calling f.remote(x) on a Ray task return right away?",
        "An object reference (a future); ray.get(ref) waits for the value",
        ("The value, once the task has finished",
         "Nothing: results must be read from the object store by name",
         "A handle to the worker process that runs f, which you can use to kill it or "
         "to wait for it"),
        "Remote calls are asynchronous: you get an ObjectRef immediately and can launch more "
        "work or pass the reference to other tasks; ray.get blocks until the value exists. "
        "Passing references between tasks keeps data in the object store."),
]
