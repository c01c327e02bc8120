"""Tutorial, part 2: the trainer. Receives every step the producer sends, until the end.

Run it first, in another terminal: ``python examples/tutorial/trainer.py
/tmp/rlwire-tutorial``. It waits for each step as it comes.
"""

from __future__ import annotations

import sys

import rlwire

PATH = sys.argv[1] if len(sys.argv) > 1 else "/tmp/rlwire-tutorial"

with rlwire.open_receiver(PATH) as receiver:
    for batch in receiver:  # waits for the next step; ends at the producer's finish()
        tokens = sum(len(s.token_ids) for s in batch.samples)
        trained = sum(int(s.mask.sum()) for s in batch.samples)
        experts = batch.samples[0].routed_experts  # a view of the file: nothing copied
        print(
            f"step {receiver.last_step}: {len(batch.samples)} samples, {tokens} tokens "
            f"({trained} trained on), routed_experts {experts.dtype} {experts.shape}",
            flush=True,
        )
print("the producer finished the stream")
