// Package replication is the only package that talks to PostgreSQL's
// replication protocol. It prepares the publication and the pgoutput slot,
// streams from the slot with protocol v1, decodes pgoutput messages into
// the package's own types (Begin, Relation, Change, Truncate, Message,
// Commit) and sends standby status updates.
//
// It decides nothing about which position is safe to confirm: SendStatus
// takes the confirmed LSN from its caller (the checkpoint tracker) and
// sends it as the flush and apply positions.
//
// Column values stay in PostgreSQL's text format with their type OIDs from
// the RELATION message; Decoder.Value turns one into a Go value by its OID.
package replication
