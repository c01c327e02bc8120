"""Two stages (a reference model, a critic) append different fields to one sealed step
at the same time, each with its own sender, as the guide's pipeline does. Both calls
must store their field (or one get a typed error that says to retry), and never lose
one silently. Usage: fields_two_stages.py [dir|s3]"""
import os, sys, tempfile
import anyio, numpy as np, rlwire

sys.path.insert(0, "/tmp/h2/tests")

async def trial(url, opts):
    async with rlwire.open_sender(url, validate=False, storage_options=opts) as s:
        async with s.open_step() as w:
            await w.put([{"token_ids": np.arange(4)}, {"token_ids": np.arange(3)}], key="g0")
    ragged = rlwire.Ragged(np.arange(7, dtype=np.float32), np.array([0, 4, 7]))
    outcome = {}

    async def stage(name):
        sender = rlwire.open_sender(url, storage_options=opts)
        try:
            await sender.add_fields(0, {name: ragged}, rank=0)
            outcome[name] = "stored"
        except rlwire.RlwireError as e:
            outcome[name] = f"{type(e).__name__}: {e}"
        finally:
            await sender.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stage, "ref_logprobs")
        tg.start_soon(stage, "values")
    with rlwire.open_receiver(url, type=list, as_columns=True, record_consumed=False, storage_options=opts) as r:
        cols = r.receive(timeout=5)
    return outcome, cols.names

def main():
    where = sys.argv[1] if len(sys.argv) > 1 else "dir"
    if where == "s3":
        from s3_server import moto_server, s3_client, _CREDENTIALS
        import uuid
        with moto_server() as endpoint:
            opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
            import boto3
            c = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
            for i in range(5):
                b = f"b{uuid.uuid4().hex[:8]}"; c.create_bucket(Bucket=b)
                print(anyio.run(trial, f"s3://{b}/run", opts))
    else:
        for i in range(5):
            print(anyio.run(trial, tempfile.mkdtemp(dir="/dev/shm"), None))
main()
