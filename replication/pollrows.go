package replication

import "errors"

// ErrPollRowsUnpublished: a slot made now would start after rows the poll
// source has not published yet, and the WAL source would never relay them
// (Config.BeforeCreate refuses its creation with it: relay.PollRowsRefusal).
var ErrPollRowsUnpublished = errors.New("replication: the poll source's table holds rows it has not published")
