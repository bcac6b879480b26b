"""How often to checkpoint: the interval that minimizes the work a failure costs.

Teaches: a checkpoint costs time on every save (``delta``), and a failure costs the work
done since the last save (half an interval on average) plus the restart. Saving often
wastes time saving; saving rarely wastes time redoing. The best interval balances the two.

* Young 1974, "A first order approximation to the optimum checkpoint interval" (CACM 17(9),
  530-531): with failures arriving at random (mean time between failures ``M``), the time
  lost per unit of useful work is about ``delta / tau + tau / (2 M)``, smallest at
  ``tau = sqrt(2 delta M)``.
* Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps"
  (Future Generation Computer Systems 22, 303-312): with exponentially distributed failures
  that may also strike during a save or a restart (restart time ``R``), a job of ``T_s``
  seconds of useful work takes on average
  ``T_w(tau) = M exp(R / M) (exp((tau + delta) / M) - 1) T_s / tau``, and the interval that
  minimizes it is, to higher order,
  ``tau = sqrt(2 delta M) (1 + sqrt(delta / (2M)) / 3 + (delta / (2M)) / 9) - delta`` for
  ``delta < 2M``, else ``M``.

Worked number: a save of 5 minutes and a failure every 24 hours (1440 minutes) give Young's
``sqrt(2 x 5 x 1440) = 120`` minutes and Daly's 116.7 minutes.

Convention (lessons): checkpoint ``step_N`` holds the state after N completed steps; a crash
as step ``s`` begins resumes from the last multiple of the interval, so ``s mod every``
steps are computed twice (``steps_redone``). Times in seconds unless said. Pure: no torch.
"""

from __future__ import annotations

import math

from labkit.theory.batch import check_int, check_number

__all__ = ["daly_interval", "expected_wall_time", "steps_redone", "waste_fraction",
           "young_interval", "young_waste_fraction"]


def steps_redone(fault_step: int, every: int) -> int:
    """Steps computed a second time when a rank dies as step ``fault_step`` begins and a
    checkpoint is committed every ``every`` completed steps (resume at the last multiple)."""
    s = check_int("fault_step", fault_step, 0, "fault_step=9")
    k = check_int("every", every, 1, "every=4")
    return s - (s // k) * k


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum: ``sqrt(2 delta M)``."""
    d = check_number("delta_s", delta_s, "delta_s=300", allow_equal=False)
    m = check_number("mtbf_s", mtbf_s, "mtbf_s=86400", allow_equal=False)
    return math.sqrt(2 * d * m)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum (his eq. for ``delta < 2M``; ``M`` beyond)."""
    d = check_number("delta_s", delta_s, "delta_s=300", allow_equal=False)
    m = check_number("mtbf_s", mtbf_s, "mtbf_s=86400", allow_equal=False)
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def expected_wall_time(tau_s: float, delta_s: float, mtbf_s: float, work_s: float,
                       restart_s: float = 0.0) -> float:
    """Daly's (2006) expected wall time of ``work_s`` seconds of useful work, saving every
    ``tau_s`` seconds of work (each save ``delta_s``), failures exponential with mean
    ``mtbf_s`` (also during saves and restarts), each restart ``restart_s``."""
    t = check_number("tau_s", tau_s, "tau_s=3600", allow_equal=False)
    d = check_number("delta_s", delta_s, "delta_s=300")
    m = check_number("mtbf_s", mtbf_s, "mtbf_s=86400", allow_equal=False)
    w = check_number("work_s", work_s, "work_s=864000")
    r = check_number("restart_s", restart_s, "restart_s=600")
    return m * math.exp(r / m) * math.expm1((t + d) / m) * w / t


def waste_fraction(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected time lost (saving, redoing, restarting) per second of useful work, by Daly's
    model: ``T_w / T_s - 1``."""
    return expected_wall_time(tau_s, delta_s, mtbf_s, 1.0, restart_s) - 1.0


def young_waste_fraction(tau_s: float, delta_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order loss per second of useful work: ``delta/tau + tau/(2M)``
    (the saves, plus half an interval redone per failure)."""
    t = check_number("tau_s", tau_s, "tau_s=3600", allow_equal=False)
    d = check_number("delta_s", delta_s, "delta_s=300")
    m = check_number("mtbf_s", mtbf_s, "mtbf_s=86400", allow_equal=False)
    return d / t + t / (2 * m)
