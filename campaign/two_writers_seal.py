"""Two producers on one step (B resumed beside a live A, as a second process would):
B commits a part A does not know of, A seals. Promise: two producers never both
succeed for one step; a rank's parts() and receive() agree with the seal."""
import os, tempfile, anyio, rlwire

async def main():
    d = tempfile.mkdtemp(dir="/dev/shm")
    async with rlwire.open_sender(d) as a:
        wa = a.open_step(ranks=2)
        await wa.__aenter__()
        await wa.put([{"token_ids": [1, 2, 3]}], key="k0")            # rank 0, part 0
        async with rlwire.open_sender(d, on_existing="resume") as b:  # a second producer
            wb = b.open_step(ranks=2)
            await wb.__aenter__()
            print("B resumed", wb.resumed)
            print("B put k1 ->", await wb.put([{"token_ids": [4]}], key="k1"), wb.assignment)
            try:
                await wa.__aexit__(None, None, None)                   # A seals
                print("A sealed", wa.assignment)
            except rlwire.RlwireError as e:
                print("A seal refused:", type(e).__name__, e)
            try:
                await wb.__aexit__(None, None, None)
                print("B sealed", wb.assignment)
            except rlwire.RlwireError as e:
                print("B seal refused:", type(e).__name__)
    print(sorted(os.listdir(d)))
    with rlwire.open_receiver(d, type=list, rank=1, record_consumed=False) as r:
        print("rank 1 parts():", [(p.key, p.value) for p in r.parts(timeout=2)])
    with rlwire.open_receiver(d, type=list, rank=1, record_consumed=False) as r:
        print("rank 1 receive():", r.receive(timeout=2))

anyio.run(main)
