"""A producer killed (-9) mid-step, resumed, finishes without sealing the open step:
a receiver part-way through that step should get EndOfStream (or the finish be refused),
not wait forever."""
import os, signal, subprocess, sys, tempfile, textwrap, time
import anyio, rlwire

d = tempfile.mkdtemp(dir="/dev/shm")
child = textwrap.dedent(f"""
    import anyio, os, rlwire, signal
    async def main():
        async with rlwire.open_sender({d!r}) as s:
            async with s.open_step() as w:
                await w.put([{{"token_ids": [1, 2]}}], key="a")
                os.kill(os.getpid(), signal.SIGKILL)
    anyio.run(main)
""")
p = subprocess.run([sys.executable, "-c", child])
print("producer exit", p.returncode)

async def resume_and_finish():
    async with rlwire.open_sender(d, on_existing="resume") as s:
        print("resumed next_step", s.next_step)
        try:
            await s.finish()
            print("finish() ACCEPTED with step", s.next_step, "open")
        except rlwire.RlwireError as e:
            print("finish refused:", type(e).__name__, e)
anyio.run(resume_and_finish)
print(sorted(os.listdir(d)))
with rlwire.open_receiver(d, type=list, record_consumed=False) as r:
    got = []
    t0 = time.monotonic()
    try:
        for part in r.parts(timeout=3):
            got.append(part.key)
        print("parts ended", got)
    except rlwire.RlwireError as e:
        print(f"after parts {got}: {type(e).__name__} after {time.monotonic()-t0:.1f}s: {e}")
