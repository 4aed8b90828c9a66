"""``accelperf bisect GOOD BAD -- NODEIDS``: the first commit of a range that made cases
worse, with the evidence of each step and the command that reproduces the last one.

How a bisection goes:

1. The range is the commits of ``GOOD..BAD`` on BAD's first-parent line, oldest first
   (``git log --first-parent``); GOOD must be on that line. Each commit that is tested
   gets a git worktree of its own, detached, under a temporary directory, removed when it
   has been tested and, whatever happens (an error, Ctrl-C, SIGTERM), at the end: the
   repository's working tree, index and branches are never touched.
2. GOOD's session records a baseline of the cases into a store of the bisection's own
   (``pytest NODEIDS --accelperf-update --accelperf-baselines=STORE``); every other commit's
   session is checked against it, so its program and memory checks *are* the comparison
   with GOOD: the plugin's own checks, not a second implementation.
3. Where BAD's compiled program (FLOPs, bytes, collectives, host callbacks and syncs,
   matmul dtypes, graph breaks; and the compiler's memory plan) is worse than GOOD's, the
   bisection is on those fields: exact, one compile per commit, nothing repeated.
4. Only where the programs agree is it on timing: BAD, then each midpoint, in A/B mode
   against GOOD (``pytest NODEIDS --accelperf-compare=GOOD`` in the midpoint's worktree),
   the statistic of :mod:`pytest_accelperf.ab`. BAD is bad by A/B mode's verdict; a
   midpoint is bad when its interval lies above the ratio halfway from GOOD to BAD's
   level (``sqrt`` of BAD's ratio), good when it lies below.
5. A commit whose session cannot say (it does not collect or import, a case errors, its
   A/B interval straddles the halfway ratio or was contaminated) is skipped as ``git
   bisect skip`` skips: the next commit nearest the middle is tried instead, and if only
   skipped commits are left between the last good and the first bad commit, all of them
   are named.

The modules, one job each, the data flowing one way: :mod:`.commits` (the range, and a
worktree of a commit), :mod:`.probe` (one pytest session at one commit, its report read
back), :mod:`.evidence` (what a session says of a commit against GOOD), :mod:`.search`
(which commit next, skips included), :mod:`.driver` (the bisection; :mod:`.releases` runs it over a
package's releases, each in an environment of its own), :mod:`.status` (its
exit statuses) and :mod:`.show` (the table, the first bad commit, the command that
reproduces the last comparison).
"""

from pytest_accelperf.errors import UserError


class BisectError(UserError):
    """The bisection cannot start or go on because of what it was given (an unknown ref,
    GOOD not an ancestor of BAD, no node ids, a GOOD whose session does not run); the
    message names it and the fix."""
