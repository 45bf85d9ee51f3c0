// Package gredis stands in for GoFrame v1's gredis: Do and DoVar, without
// a context.
package gredis

type Var struct{}

func (v *Var) Strings() []string { return nil }
func (v *Var) Int() int          { return 0 }

type Redis struct{}

func (r *Redis) Do(command string, args ...interface{}) (interface{}, error) { return nil, nil }
func (r *Redis) DoVar(command string, args ...interface{}) (*Var, error)     { return nil, nil }
