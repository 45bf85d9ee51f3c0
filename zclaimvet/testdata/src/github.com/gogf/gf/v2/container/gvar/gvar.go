// Package gvar stands in for GoFrame's gvar: a reply.
package gvar

type Var struct{ v any }

type Vars []*Var

func (v *Var) Val() any           { return v.v }
func (v *Var) Int() int           { return 0 }
func (v *Var) Int64() int64       { return 0 }
func (v *Var) IsNil() bool        { return v == nil }
func (v *Var) IsEmpty() bool      { return true }
func (v *Var) Strings() []string  { return nil }
func (vs Vars) Strings() []string { return nil }
