package router

import (
	"errors"
	"sort"
	"strings"
	"time"
)

// Set routes rows of several outbox tables, each with its own options: a
// Router per table named in NewSet's perTable, and a default Router for
// every other table. Like a Router, a Set is not safe for concurrent use.
type Set struct {
	def    *Router
	tables map[string]*Router
}

// NewSet validates the default options and each table's options and
// returns a Set. perTable maps a table, schema-qualified ("public.outbox";
// a name without a schema means public, as in table.include.list) to that
// table's complete options: start each from a copy of def (or from
// DefaultOptions) and change what differs, for example RouteTopic for a
// fixed topic. Every invalid option is reported, as an *OptionError whose
// Table names the table (empty for def).
func NewSet(def Options, perTable map[string]Options) (*Set, error) {
	var errs []error
	s := &Set{tables: make(map[string]*Router, len(perTable))}
	r, err := newRouter(def, "")
	if err != nil {
		errs = append(errs, err)
	}
	s.def = r
	names := make([]string, 0, len(perTable))
	for name := range perTable {
		names = append(names, name)
	}
	sort.Strings(names) // report errors in a stable order
	given := make(map[string]string, len(names))
	for _, name := range names {
		table, ok := qualifyTable(name)
		if !ok {
			errs = append(errs, &OptionError{Table: name, Reason: "is not a table name (schema.table or table)", Err: ErrInvalidOption})
			continue
		}
		r, err := newRouter(perTable[name], table)
		if err != nil {
			errs = append(errs, err)
		}
		if prev, dup := given[table]; dup {
			errs = append(errs, &OptionError{Table: name, Reason: "names the same table as " + prev + " (" + table + ")", Err: ErrInvalidOption})
			continue
		}
		given[table] = name
		s.tables[table] = r
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// qualifyTable returns "schema.table" for name, adding "public." when name
// has no schema.
func qualifyTable(name string) (string, bool) {
	name = strings.TrimSpace(name)
	schema, table, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, table = "public", name
	}
	if schema == "" || table == "" {
		return "", false
	}
	return schema + "." + table, true
}

// Route routes row with the Router of row.Table, or the default Router when
// the table has no options of its own. See Router.Route.
func (s *Set) Route(row *Row, now time.Time, rec *Record) (Action, error) {
	return s.For(row.Table).Route(row, now, rec)
}

// For returns the Router for table (schema-qualified, as Row.Table): the
// table's own, or the default one.
func (s *Set) For(table string) *Router {
	if r, ok := s.tables[table]; ok {
		return r
	}
	return s.def
}

// EventColumns returns the columns the Router reads every event's id, key,
// payload and routing value from (table.field.event.id, .key, .payload,
// route.by.field); route is empty with a fixed topic, which reads none.
func (r *Router) EventColumns() (id, key, payload, route string) {
	route = r.cfg.routeCol
	if r.cfg.fixedTopic != "" {
		route = ""
	}
	return r.cfg.idCol, r.cfg.keyCol, r.cfg.payloadCol, route
}

// ConnectColumn is a column a Router writes through a Kafka Connect
// converter, and where to.
type ConnectColumn struct {
	Column, Where string
}

// ConnectColumns returns the columns the Router writes through a Kafka
// Connect converter (the key through key.converter, the payload and the
// envelope placements through value.converter, the id and the header
// placements through header.converter), whose types ConnectTypeRefused
// judges. Columns written raw are not among them.
func (r *Router) ConnectColumns() []ConnectColumn {
	var out []ConnectColumn
	if r.cfg.keyConv != convRaw {
		out = append(out, ConnectColumn{r.cfg.keyCol, "the key (" + optKeyConverter + ")"})
	}
	if r.cfg.valueConv != convRaw {
		out = append(out, ConnectColumn{r.cfg.payloadCol, "the value (" + optValueConverter + ")"})
	}
	if r.cfg.headerConv != convRaw {
		out = append(out, ConnectColumn{r.cfg.idCol, "the id header (" + optHeaderConverter + ")"})
	}
	for _, f := range r.cfg.extras {
		switch {
		case f.place == placeHeader && r.cfg.headerConv != convRaw:
			out = append(out, ConnectColumn{f.column, "header " + f.name + " (" + optHeaderConverter + ")"})
		case f.place == placeEnvelope && r.cfg.valueConv == convJSON:
			out = append(out, ConnectColumn{f.column, "envelope field " + f.name + " (" + optValueConverter + ")"})
		}
	}
	return out
}
