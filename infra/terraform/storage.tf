# Results bucket and notification queue: agents put results under the prefix, S3 tells the queue.

resource "aws_s3_bucket" "results" {
  #checkov:skip=CKV_AWS_18:Short-lived rollout results; CloudTrail data events are the audit trail where one is needed, not a second logging bucket.
  #checkov:skip=CKV_AWS_21:Results are written once (If-None-Match) and expire; versions would only keep copies of expired results.
  #checkov:skip=CKV_AWS_144:Rollout results are reproducible training by-products; cross-region replication is not worth its cost.
  #checkov:skip=CKV_AWS_145:SSE-S3 keeps S3 event delivery to SQS and the agents free of KMS grants; no customer key is required for this data.
  bucket_prefix = "agentcore-rollout-"
}

resource "aws_s3_bucket_public_access_block" "results" {
  bucket                  = aws_s3_bucket.results.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "results" {
  bucket = aws_s3_bucket.results.id

  rule {
    id     = "ExpireRolloutResults"
    status = "Enabled"

    filter {
      prefix = local.result_key_prefix
    }

    expiration {
      days = var.result_expiration_days
    }
  }

  rule {
    id     = "AbortIncompleteUploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

data "aws_iam_policy_document" "results_bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.results.arn, "${aws_s3_bucket.results.arn}/*"]

    principals {
      type        = "AWS"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "results" {
  bucket     = aws_s3_bucket.results.id
  policy     = data.aws_iam_policy_document.results_bucket.json
  depends_on = [aws_s3_bucket_public_access_block.results]
}

# Set on the bucket: atomic with the write path. S3 checks the queue policy when this is set.
resource "aws_s3_bucket_notification" "results" {
  bucket = aws_s3_bucket.results.id

  queue {
    id            = "rollout-results"
    queue_arn     = aws_sqs_queue.notifications.arn
    events        = ["s3:ObjectCreated:*"]
    filter_prefix = local.result_key_prefix
    filter_suffix = ".json"
  }

  depends_on = [aws_sqs_queue_policy.notifications]
}

resource "aws_sqs_queue" "dead_letter" {
  name_prefix               = "agentcore-rollout-dlq-"
  sqs_managed_sse_enabled   = true
  message_retention_seconds = 1209600
}

resource "aws_sqs_queue" "notifications" {
  name_prefix                = "agentcore-rollout-"
  sqs_managed_sse_enabled    = true
  visibility_timeout_seconds = 60
  message_retention_seconds  = 345600
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dead_letter.arn
    maxReceiveCount     = var.max_receive_count
  })
}

data "aws_iam_policy_document" "notifications_queue" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.notifications.arn]

    principals {
      type        = "AWS"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "AllowObjectCreatedEventsFromResultsBucket"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.notifications.arn]

    principals {
      type        = "Service"
      identifiers = ["s3.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.results.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_sqs_queue_policy" "notifications" {
  queue_url = aws_sqs_queue.notifications.id
  policy    = data.aws_iam_policy_document.notifications_queue.json
}

data "aws_iam_policy_document" "dead_letter_queue" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.dead_letter.arn]

    principals {
      type        = "AWS"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "dead_letter" {
  queue_url = aws_sqs_queue.dead_letter.id
  policy    = data.aws_iam_policy_document.dead_letter_queue.json
}
