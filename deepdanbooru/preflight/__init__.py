"""Read-only checks before training. Standard library only: no TensorFlow, numpy or Pillow here.

    images.inspect_image(path) -> ImageInfo(format, width, height, animated, has_alpha)
        raises images.BadImage (an ImageError) with a short `.reason`: missing, empty,
        truncated, corrupt, not an image. Format from the signature, not the name.
    images.image_problem(path, max_pixels=None) -> str | None
        the same as a reason string, for logs that explain a dropped record.
    main.training_preflight(project, max_image_checks=20, check_packages=False,
                            probe_imports=False, probe_tensorflow=False) -> list[CheckResult]
    main.validate_project_config(project, check_paths=False) -> list[CheckResult]
    main.report(project, results, as_json=False, echo=print) -> exit code (0 all good, 1 a FAIL)
    results.CheckResult(name, status, detail); status is PASS, WARN, FAIL, or SKIP (a check it
        needs failed first; the FAIL already names the cause).

scripts/training_preflight.py, scripts/validate_project_config.py and
`deepdanbooru preflight` are thin wrappers around main. TensorFlow is only ever
imported in child processes (--probe-imports, --probe-tensorflow).
"""
