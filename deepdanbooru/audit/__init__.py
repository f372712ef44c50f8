"""The tag audit: rank the labels most likely wrong from out-of-sample scores, and apply accepted fixes."""
