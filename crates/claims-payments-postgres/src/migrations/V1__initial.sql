-- The PostgreSQL store's schema: the same records and fields as the SQLite store
-- (src/store/sqlite.rs), in PostgreSQL's own types. The guard is the two primary keys:
-- (consumer, claim_id, message_id) for the inbox and (claim_id, purpose) for payments.
--
-- message_id is bytea (its UTF-8 bytes): a Service Bus MessageId may hold any character,
-- NUL included, which PostgreSQL text refuses. Key text columns use the "C" collation:
-- byte order, as SQLite compares, and independent of the database's locale.
-- Timestamps are written at millisecond precision, as every store keeps them.

CREATE TABLE inbox (
    consumer             text COLLATE "C" NOT NULL,
    claim_id             uuid        NOT NULL,
    message_id           bytea       NOT NULL,
    payload_hash         text        NOT NULL,
    status               text        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    outcome              text,
    owner                uuid        NOT NULL,
    lease_until          timestamptz,
    first_delivery_count integer     NOT NULL,
    last_delivery_count  integer     NOT NULL,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    expires_at           timestamptz NOT NULL,
    version              bigint      NOT NULL,
    PRIMARY KEY (consumer, claim_id, message_id)
);
-- The retention purge deletes by expiry, in batches.
CREATE INDEX inbox_expiry ON inbox (expires_at);
-- `claims-payments inbox` lists oldest first.
CREATE INDEX inbox_created ON inbox (created_at, message_id);

CREATE TABLE payments (
    claim_id        uuid        NOT NULL,
    purpose         text COLLATE "C" NOT NULL,
    tenant_id       text,
    amount          text        NOT NULL,
    currency        text        NOT NULL,
    payee           text,
    payload_hash    text        NOT NULL,
    message_id      bytea       NOT NULL,
    idempotency_key text        NOT NULL,
    payout_request  text,
    status          text        NOT NULL CHECK (status IN
                        ('recorded', 'in_progress', 'paid', 'rejected', 'needs_reconciliation', 'mismatched')),
    bank_payment_id text,
    status_reason   text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    version         bigint      NOT NULL,
    PRIMARY KEY (claim_id, purpose)
);
CREATE INDEX payments_created ON payments (created_at, claim_id);
-- What reconcile lists and counts: the few payments not settled yet, oldest first.
CREATE INDEX payments_open ON payments (status, created_at, claim_id)
    WHERE status IN ('in_progress', 'needs_reconciliation', 'mismatched');

-- The claim, in one call (one round trip): both rows or neither, and on a refusal the
-- record that refused it. A VOLATILE function takes a new snapshot for every statement,
-- so the row a conflict waited for (committed by a concurrent claim) is visible to the
-- read that follows it, which one plain statement's snapshot would not show.
--
-- Both inserts run in the caller's transaction (one statement: an implicit one). When
-- the payment is refused, the inbox row inserted a moment before is deleted again in the
-- same transaction, so it never becomes visible: a concurrent claim of the same message
-- waited for this transaction and finds no row afterwards. (A DELETE of our own row
-- instead of a BEGIN ... EXCEPTION block: that would open a subtransaction on every claim.)
--
-- kind: 'claimed' (both rows inserted, version 1), 'inbox' (the message's inbox row
-- exists: it is returned), 'payment' (the claim's payment exists: it is returned),
-- 'vanished' (a conflicting row was deleted before it could be read: try again).
CREATE FUNCTION claims_payments_claim(new_inbox inbox, new_payment payments)
RETURNS TABLE (kind text, inbox_row inbox, payment_row payments)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO inbox SELECT (new_inbox).* ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'inbox'::text, i, NULL::payments FROM inbox i
            WHERE i.consumer = new_inbox.consumer AND i.claim_id = new_inbox.claim_id
              AND i.message_id = new_inbox.message_id;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'vanished'::text, NULL::inbox, NULL::payments;
        END IF;
        RETURN;
    END IF;
    INSERT INTO payments SELECT (new_payment).* ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        DELETE FROM inbox i
            WHERE i.consumer = new_inbox.consumer AND i.claim_id = new_inbox.claim_id
              AND i.message_id = new_inbox.message_id;
        RETURN QUERY SELECT 'payment'::text, NULL::inbox, p FROM payments p
            WHERE p.claim_id = new_payment.claim_id AND p.purpose = new_payment.purpose;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'vanished'::text, NULL::inbox, NULL::payments;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'claimed'::text, NULL::inbox, NULL::payments;
END
$$;

-- The finalize, in one call: the inbox row if it still carries inbox_version (our lease
-- was not taken over) and the payment's outcome if it still carries payment_version (when
-- given). Otherwise it raises, which rolls back the whole statement, the inbox update
-- included: SQLSTATE CP412 (a precondition failed) or CP404 (the payment is missing).
CREATE FUNCTION claims_payments_finalize(
    new_inbox inbox, inbox_version bigint, new_payment payments, payment_version bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    next_version bigint;
BEGIN
    UPDATE inbox i SET payload_hash = new_inbox.payload_hash, status = new_inbox.status,
           outcome = new_inbox.outcome, owner = new_inbox.owner,
           lease_until = new_inbox.lease_until,
           first_delivery_count = new_inbox.first_delivery_count,
           last_delivery_count = new_inbox.last_delivery_count,
           updated_at = new_inbox.updated_at, expires_at = new_inbox.expires_at,
           version = i.version + 1
     WHERE i.consumer = new_inbox.consumer AND i.claim_id = new_inbox.claim_id
       AND i.message_id = new_inbox.message_id AND i.version = inbox_version
    RETURNING i.version INTO next_version;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the inbox record changed since it was read' USING ERRCODE = 'CP412';
    END IF;
    UPDATE payments p SET status = new_payment.status,
           bank_payment_id = new_payment.bank_payment_id,
           status_reason = new_payment.status_reason,
           updated_at = new_payment.updated_at, version = p.version + 1
     WHERE p.claim_id = new_payment.claim_id AND p.purpose = new_payment.purpose
       AND (payment_version IS NULL OR p.version = payment_version);
    IF NOT FOUND THEN
        IF payment_version IS NULL THEN
            RAISE EXCEPTION 'the payment is missing at finalize' USING ERRCODE = 'CP404';
        END IF;
        RAISE EXCEPTION 'the payment record changed since it was read' USING ERRCODE = 'CP412';
    END IF;
    RETURN next_version;
END
$$;
