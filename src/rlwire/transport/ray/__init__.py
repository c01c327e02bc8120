"""Ray sink and source: ``ray://NAME`` keeps each step in Ray's object store.

For frameworks that already run on Ray (verl, OpenRLHF, SkyRL, NeMo-RL, ...): a rollout
actor sends with ``open_sender("ray://rollouts")``; trainer actors receive with
``open_receiver("ray://rollouts", rank=r)``; each rank's frame buffers go into the
object store as out-of-band buffers (no pickle of user data) and trainers on the same
node map them without a copy.

A named async actor, the *board* (``rlwire-board:NAME``), records per step and rank the
object references, the step's commit (or, for a step filled part by part, each part's
commit and the seal), each rank's consumption mark (``keep_last``, ``max_ahead``) and
the end of the stream; receivers wait on it instead of polling.

What survives what:

* a producer's death, after a commit: every committed step, when the producer runs in
  an async (or threaded) actor: the board owns the objects, pulled from the producer as
  the return values of a call the board makes. A producer in a driver or a task owns
  what it sends (``ray.put``), and those steps die with it
  (:attr:`RaySink.board_owned` says which).
* the board's death: nothing. The board dies with the process that created it unless
  created ``detached`` (create it in the driver with :func:`create_board`, or pass the
  storage option ``detached=True``). For resume after the board or the cluster is lost,
  send every step to a durable destination as well (a directory, ``s3://``).

The modules, one concept each:

``_payload``
    a rank's message as the objects it is stored as, and back (checksums verified)
``_handover``
    how the board comes to own what a producer's actor sends
``_board``
    the board actor
``_board_parts``
    its parts and seals
``_board_fields``
    the fields appended to its steps
``_board_staged``
    what senders staged on it, not committed yet, and why what it let go of went
``_handing``
    how a sender hands a message's objects to the board, not waiting for its answer
``_staged``
    what a sender has staged on the board, and its commit
``_actors``
    finding, creating and calling the board
``_handle``
    :class:`StepHandle`, a committed step to pass to a trainer
``_sink`` / ``_source``
    :class:`RaySink` and :class:`RaySource`
``_answers``
    what the board answers a receiver, checked (any client can call the board)
``_waiting``
    a receiver's async waits on the board, one at a time, cancelled or not
``_appended``
    their appended fields (``add_fields``)
"""

from rlwire._core.faces import claim
from rlwire.transport.ray._actors import create_board, drop_board
from rlwire.transport.ray._handle import StepHandle
from rlwire.transport.ray._sink import RaySink
from rlwire.transport.ray._source import RaySource

__all__ = ["RaySink", "RaySource", "StepHandle", "create_board", "drop_board"]

claim(__name__, globals(), __all__)
