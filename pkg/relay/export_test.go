package relay

import "time"

// WithSnapshotPersistFault makes f run before each attempt of the initial
// snapshot makes the slot: an error it returns fails the attempt there, as
// a connection lost at that moment would, which a real server cannot be
// made to do on demand.
func WithSnapshotPersistFault(f func() error) Option {
	return func(r *Relay) { r.persistFault = f }
}

// WithSnapshotExportedHook makes f run each time a new initial snapshot has
// been exported, before anything reads it: what f commits is after the
// snapshot, at a moment a test cannot otherwise reach.
func WithSnapshotExportedHook(f func()) Option {
	return func(r *Relay) { r.exportedHook = f }
}

// TopicSettingsFresh is how recently a topic's settings must have been
// read for a record to be refused by them.
const TopicSettingsFresh = topicSettingsFresh

// WithStandbyPoll makes a standby try to take the slot over every d (at
// random in [d/2, d]) instead of every standbyPoll.
func WithStandbyPoll(d time.Duration) Option {
	return func(r *Relay) { r.standbyPollEvery = d }
}
