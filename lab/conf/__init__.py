"""lab's own config groups, one directory per group, one YAML per option (Hydra reads them as
package resources, so an installed wheel has them too)."""
