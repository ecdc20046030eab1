"""The floor of a remote publish: 200 objects (10 MiB in all) PUT create-if-absent straight to
S3 with boto3, 16 in flight (as skillbox uploads). Prints the median milliseconds of `runs`.
Run by scripts/bench-scale-out with a virtualenv's python that has boto3.

Usage: python bench_s3_puts.py ENDPOINT BUCKET RUNS
"""
import concurrent.futures, hashlib, random, statistics, sys, time

import boto3

endpoint, bucket, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id="skillbox", aws_secret_access_key="skillbox-test-secret")
rnd = random.Random(5)
times = []
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    for i in range(runs):
        blobs = [rnd.randbytes((10 << 20) // 200) for _ in range(200)]
        objects = [(f"raw/{hashlib.sha256(b).hexdigest()}", b) for b in blobs]
        t = time.perf_counter()
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1], IfNoneMatch="*"), objects))
        times.append(time.perf_counter() - t)
print(statistics.median(times) * 1000)
