"""AWS, behind one module: the only importer of boto3. Auto Scaling Groups mark an instance
unhealthy (the group replaces it) or terminate it without shrinking the group."""

from __future__ import annotations

import re
from typing import Any

from sweeper.errors import ConfigError, SweeperError

_PROVIDER_ID = re.compile(r"^aws:///(?P<zone>[a-z0-9-]+)/(?P<iid>i-[0-9a-f]+)$")


class AwsError(SweeperError):
    exit_code = 3


# boto3's credential chain, in the order it looks
# (https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html).
CHAIN = ("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE+AWS_ROLE_ARN (IRSA)",
         "AWS_CONTAINER_CREDENTIALS_FULL_URI (EKS Pod Identity)", "~/.aws/credentials and ~/.aws/config",
         "the instance metadata service")
ACTIONS = ("autoscaling:DescribeAutoScalingInstances", "autoscaling:SetInstanceHealth",
           "autoscaling:TerminateInstanceInAutoScalingGroup")  # every Auto Scaling call below, and nothing else
# The evidence bucket's calls (only with `evidence_bucket` set): Sweeper's role puts, a reader gets.
EVIDENCE_ACTIONS = ("s3:PutObject", "s3:GetObject")


def require_credentials(why: str) -> None:
    """Raise AwsError (exit 3) when boto3's credential chain finds nothing: said before any node is
    taken, not as a node held later because its replacement failed. IRSA's token is exchanged when
    first used; EKS Pod Identity's agent is asked here, and an agent that does not answer is an error."""
    import boto3

    try:
        found = boto3.Session().get_credentials()
    except Exception as exc:  # a broken profile or token file is as missing as none
        raise AwsError(f"{why}, but boto3 could not load AWS credentials: {exc}") from exc
    if found is None:
        raise AwsError(f"{why}, but boto3 found no AWS credentials (looked in: {'; '.join(CHAIN)}): give "
                       f"Sweeper's service account an IAM role through IRSA or EKS Pod Identity allowed "
                       f"{', '.join(ACTIONS)}")


def instance_of(provider_id: str) -> tuple[str, str]:
    """(zone, instance id) from a node's spec.providerID, `aws:///us-east-1a/i-0abc...`."""
    m = _PROVIDER_ID.match(provider_id or "")
    if not m:
        raise ConfigError(f"not an AWS provider id: {provider_id!r}")
    return m.group("zone"), m.group("iid")


def region_of(zone: str) -> str:
    """us-east-1a -> us-east-1; a Local Zone (us-west-2-lax-1a) keeps its parent region."""
    parts = zone.split("-")
    if len(parts) >= 3 and parts[2][:1].isdigit():
        return "-".join(parts[:2] + [parts[2].rstrip("abcdefghijklmnopqrstuvwxyz")])
    return zone.rstrip("abcdefghijklmnopqrstuvwxyz")


class AutoScaling:
    def __init__(self, region: str, endpoint_url: str | None = None) -> None:
        import boto3

        self.region = region
        self.client: Any = boto3.client("autoscaling", region_name=region, endpoint_url=endpoint_url)

    def group_of(self, instance_id: str) -> str | None:
        try:
            found = self.client.describe_auto_scaling_instances(InstanceIds=[instance_id])
        except Exception as exc:  # botocore's ClientError and connection errors alike
            raise AwsError(f"describe_auto_scaling_instances {instance_id}: {exc}") from exc
        rows = found.get("AutoScalingInstances") or []
        return rows[0]["AutoScalingGroupName"] if rows else None

    def set_unhealthy(self, instance_id: str) -> None:
        try:
            self.client.set_instance_health(InstanceId=instance_id, HealthStatus="Unhealthy",
                                            ShouldRespectGracePeriod=False)
        except Exception as exc:
            raise AwsError(f"set_instance_health {instance_id}: {exc}") from exc

    def terminate(self, instance_id: str) -> None:
        try:
            self.client.terminate_instance_in_auto_scaling_group(InstanceId=instance_id,
                                                                 ShouldDecrementDesiredCapacity=False)
        except Exception as exc:
            raise AwsError(f"terminate_instance_in_auto_scaling_group {instance_id}: {exc}") from exc


class EvidenceBucket:
    """Held nodes' evidence bundles in S3 (config `evidence_bucket`), one object a node and run,
    written when the node is held, as EKS's node diagnostics upload a node's logs to S3 at failure
    time (https://docs.aws.amazon.com/eks/latest/userguide/auto-get-logs.html)."""

    def __init__(self, bucket: str, prefix: str = "", region: str | None = None,
                 endpoint_url: str | None = None) -> None:
        import boto3

        self.bucket, self.prefix = bucket, prefix
        self.client: Any = boto3.client("s3", region_name=region or None, endpoint_url=endpoint_url)

    def key(self, cluster: str, node: str, run_id: str) -> str:
        safe = [re.sub(r"[^A-Za-z0-9._-]", "_", p)[:120] or "_" for p in (cluster, node, run_id)]
        return f"{self.prefix}{safe[0]}/{safe[1]}/{safe[2]}.tar.gz"

    def put(self, key: str, bundle: bytes, sha256: str) -> str:
        """Store the bundle; its address, s3://bucket/key."""
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=bundle, ContentType="application/gzip",
                                   Metadata={"sha256": sha256})
        except Exception as exc:
            raise AwsError(f"put_object s3://{self.bucket}/{key}: {exc}") from exc
        return f"s3://{self.bucket}/{key}"

    def get(self, location: str, limit: int) -> bytes:
        """The bundle at an s3:// address this class wrote (at most `limit` bytes are read)."""
        m = re.fullmatch(r"s3://([^/]+)/(.+)", location)
        if m is None:
            raise AwsError(f"not an s3:// address: {location!r}")
        try:
            body = self.client.get_object(Bucket=m.group(1), Key=m.group(2))["Body"]
            data: bytes = body.read(limit + 1)
        except Exception as exc:
            raise AwsError(f"get_object {location}: {exc}") from exc
        if len(data) > limit:
            raise AwsError(f"{location} is larger than {limit} bytes: not a bundle Sweeper wrote")
        return data
