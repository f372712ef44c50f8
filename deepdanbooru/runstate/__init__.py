"""What a training run leaves in a project between processes (standard library only).

Shared by the trainer and by preflight, which must answer without TensorFlow:
    state.Counters, state.RunIdentity, state.write_state_json / read_state_json, state.check_identity
    lock.TrainingLock(path, echo), lock.read_owner(path), lock.owner_is_stale(path, owner)
    cluster.cluster_role() -> ClusterRole (from TF_CONFIG), cluster.parse_devices("0,1") -> DeviceChoice
"""
