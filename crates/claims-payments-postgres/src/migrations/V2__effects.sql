-- The once-guard's effects (the engine's store::once::OnceStore): an effect row written
-- with its message's inbox row, or neither; never purged. The same columns as the SQLite
-- store's `effects`, in PostgreSQL's types (message_id as bytea, as in the inbox). The
-- guard is the inbox's primary key and this one.
CREATE TABLE effects (
    kind       text COLLATE "C" NOT NULL,
    claim_id   uuid        NOT NULL,
    effect_key text COLLATE "C" NOT NULL,
    message_id bytea       NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (kind, claim_id, effect_key)
);
-- A kind's effects are listed oldest first.
CREATE INDEX effects_by_kind ON effects (kind, created_at, claim_id, effect_key);

-- record_once, in one call, as claims_payments_claim (V1) with the effect in the place of
-- the payment: both rows in the statement's transaction or neither (a refused effect
-- deletes the inbox row inserted a moment before), and on a refusal the row that refused.
--
-- answer: 'recorded' (both rows inserted), 'inbox' (the message's inbox row exists: it is
-- returned), 'effect' (the effect's row exists: it is returned), 'vanished' (a
-- conflicting row was deleted before it could be read: try again).
CREATE FUNCTION claims_payments_record_once(new_inbox inbox, new_effect effects)
RETURNS TABLE (answer text, inbox_row inbox, effect_row effects)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    INSERT INTO inbox SELECT (new_inbox).* ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'inbox'::text, i, NULL::effects FROM inbox i
            WHERE i.consumer = new_inbox.consumer AND i.claim_id = new_inbox.claim_id
              AND i.message_id = new_inbox.message_id;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'vanished'::text, NULL::inbox, NULL::effects;
        END IF;
        RETURN;
    END IF;
    INSERT INTO effects SELECT (new_effect).* ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        DELETE FROM inbox i
            WHERE i.consumer = new_inbox.consumer AND i.claim_id = new_inbox.claim_id
              AND i.message_id = new_inbox.message_id;
        RETURN QUERY SELECT 'effect'::text, NULL::inbox, e FROM effects e
            WHERE e.kind = new_effect.kind AND e.claim_id = new_effect.claim_id
              AND e.effect_key = new_effect.effect_key;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'vanished'::text, NULL::inbox, NULL::effects;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'recorded'::text, NULL::inbox, NULL::effects;
END
$$;
